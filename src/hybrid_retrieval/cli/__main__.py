import sys

from hybrid_retrieval.cli import main

sys.exit(main())
