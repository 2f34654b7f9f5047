from stacx.cli import main

if __name__ == "__main__":  # `python -m stacx`; importing this module runs nothing
    main()
