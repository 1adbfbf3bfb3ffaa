from pipesched.cli import main

main()
