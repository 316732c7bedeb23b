from orchestrator.cli.group import main

main()
