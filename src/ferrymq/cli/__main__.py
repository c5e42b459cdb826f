from ferrymq.cli.main import main

main()
