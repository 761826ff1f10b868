from omniserve.cli import main

raise SystemExit(main())
