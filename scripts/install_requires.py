"""Print setup.py's install_requires, one a line, without running setup.py.

The image installs the dependencies in a layer of their own, before the source is copied, so
that a code change does not reinstall them; setup.py reads README.md, so it cannot run there.
"""
import ast
import sys


def install_requires(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return ast.literal_eval(node.value)
    raise SystemExit(f"{path}: no install_requires")


if __name__ == "__main__":
    print("\n".join(install_requires(sys.argv[1] if len(sys.argv) > 1 else "setup.py")))
