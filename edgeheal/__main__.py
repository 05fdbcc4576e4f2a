from edgeheal.cli import main

raise SystemExit(main())
