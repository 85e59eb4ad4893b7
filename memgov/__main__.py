from memgov.cli import main

main()
