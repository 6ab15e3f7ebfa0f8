"""Where this installation keeps the package's data files: ``skill_models/``, ``config/``, ``launch/``."""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = "timely_llm"


def share_dir() -> Path:
    """The checkout's root (source tree), else ``share/timely_llm`` found through the ament index (a colcon install:
    ``source install/setup.bash`` puts it on AMENT_PREFIX_PATH), else under the Python prefix (the venv that
    scripts/build_interfaces.sh installs into)."""
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "package.xml").is_file():
        return checkout
    try:  # the index reader only: a file lookup on AMENT_PREFIX_PATH, no ROS middleware
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory
    except ImportError:
        pass
    else:
        try:
            return Path(get_package_share_directory(PACKAGE))
        except PackageNotFoundError:
            pass
    return Path(sys.prefix) / "share" / PACKAGE
