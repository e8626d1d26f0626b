"""An agent that prints its whole environment before it plays (what a careless agent's log holds), and fails its
episode ``r0-e1`` (so that one log is kept): examples/byo_agent/agent.py plays the others."""

import json
import os
import runpy
import sys
from pathlib import Path

print(json.dumps(dict(os.environ)), flush=True)
(Path(os.environ.get("HOME", ".")) / f"agent-env-{os.environ['CTU_EPISODE_ID']}.json").write_text(
    json.dumps(dict(os.environ)))
if os.environ["CTU_EPISODE_ID"] == "r0-e1":
    sys.exit(f"failing on purpose; my environment: {json.dumps(dict(os.environ))}")
runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "byo_agent" / "agent.py"), run_name="__main__")
