from pipesched.cli import run

run()
