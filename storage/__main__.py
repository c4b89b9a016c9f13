import sys

from storage.admin.cli import main

if __name__ == "__main__":
    sys.exit(main())
