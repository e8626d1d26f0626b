"""Building blocks shared by every domain, split by job.

- :mod:`~ctu.domains.base.db`: the copy-on-write :class:`DBView` episodes write through;
- :mod:`~ctu.domains.base.schema`: annotation -> JSON schema, and argument validation;
- :mod:`~ctu.domains.base.tools`: :func:`tool`, :class:`Tool`, :func:`run_tool`;
- :mod:`~ctu.domains.base.tasks`: :class:`Task`, :class:`Action`, :class:`EnvAssertion`, :class:`Domain`;
- :mod:`~ctu.domains.base.arith`: the ``calculate`` tools' arithmetic (eval's answers, bounded).

Everything is re-exported here, so ``from ctu.domains.base import Domain, tool`` keeps working.
"""

from ctu.domains.base.db import DBView, canonical
from ctu.domains.base.schema import json_schema, validate
from ctu.domains.base.tasks import TWIN, Action, Domain, EnvAssertion, Task
from ctu.domains.base.tools import Tool, ToolError, ToolResult, run_tool, to_json_text, tool

__all__ = ["TWIN", "Action", "DBView", "Domain", "EnvAssertion", "Task", "Tool", "ToolError", "ToolResult", "canonical",
           "json_schema", "run_tool", "to_json_text", "tool", "validate"]
