"""``specbuild.client.prompts`` is :mod:`specbuild.prompts` (shared with training), under its old name.

The alias is the module object itself, so a test that patches ``specbuild.client.prompts.X`` patches
what the client, the pipeline and training read.
"""

import sys

from specbuild import prompts

sys.modules[__name__] = prompts
