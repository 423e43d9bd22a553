import sys


def main(argv=None) -> int:
    print("hpccoll-eigensolver: not built yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
