"""``python -m timely_llm.cli``."""

import sys

from timely_llm.cli import main

sys.exit(main())
