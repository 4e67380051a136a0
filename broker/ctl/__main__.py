"""`python -m broker.ctl`: hare-ctl without the installed script."""

import sys

from broker.ctl import main

sys.exit(main())
