from edge_agent.cli.main import main

raise SystemExit(main())
