from booklens.cli import main

main()
