from stacx.cli import main

main()
