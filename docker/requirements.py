"""Print the project's requirements (dependencies + the named extras) from pyproject.toml, one a line.

The images install these before copying the code, so a code change does not reinstall them.
"""

import sys

import tomllib

with open(sys.argv[1], "rb") as pyproject:
    project = tomllib.load(pyproject)["project"]
print("\n".join(project["dependencies"] + [req for extra in sys.argv[2:] for req in project["optional-dependencies"][extra]]))
