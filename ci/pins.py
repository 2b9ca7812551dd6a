"""Print the pinned requirements of one install step, read from pyproject.toml.

python ci/pins.py torch        -> torch==2.13.0
python ci/pins.py main         -> every [project].dependencies pin except torch
python ci/pins.py no-deps      -> [tool.lmcache-pbt].no-deps
python ci/pins.py engine-torch -> the engine environment's torch pin
python ci/pins.py engine       -> the rest of [tool.lmcache-pbt].engine
python ci/pins.py engine-remove-> what ci/setup.sh uninstalls from the engine environment
python ci/pins.py EXTRA ...    -> the pins of [project.optional-dependencies].EXTRA
"""

import pathlib
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def pins(step: str) -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = data["project"]["dependencies"]
    if step == "torch":
        return [d for d in deps if d.startswith("torch==")]
    if step == "main":
        return [d for d in deps if not d.startswith("torch==")]
    if step == "no-deps":
        return list(data["tool"]["lmcache-pbt"]["no-deps"])
    if step == "engine-torch":
        return [d for d in data["tool"]["lmcache-pbt"]["engine"] if d.startswith("torch==")]
    if step == "engine":
        return [d for d in data["tool"]["lmcache-pbt"]["engine"] if not d.startswith("torch==")]
    if step == "engine-remove":
        return list(data["tool"]["lmcache-pbt"]["engine-remove"])
    extras = data["project"]["optional-dependencies"]
    if step not in extras:
        raise SystemExit(f"ci/pins.py: unknown step {step!r} (torch, main, no-deps, {', '.join(extras)})")
    return list(extras[step])


if __name__ == "__main__":
    out: list[str] = []
    for step in sys.argv[1:]:
        out.extend(pins(step))
    print(" ".join(out))
