"""Stand-in for the get-pip script that ansible-test downloads to bootstrap pip in its venvs.

ensurepip installs the pip wheel that ships with the interpreter; that pip then installs the versions
ansible-test asks for from the configured index. setuptools and wheel are not needed by pip 24.
"""

import subprocess
import sys

pip_args = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install", *pip_args])
