"""`import tasks`, kept for existing code and gin configs: the same registry as `import templm.tasks`, which is the
name to use where a project has its own tasks.py (a common T5X layout) that would shadow this package."""

import sys

from templm.tasks import *  # noqa: F401,F403  (configure, current, the mixture helpers; see templm/tasks)
from templm.tasks import registry

sys.modules[__name__ + ".registry"] = registry  # `import tasks.registry` keeps working
