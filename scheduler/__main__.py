from scheduler.cli.main import main

raise SystemExit(main())
