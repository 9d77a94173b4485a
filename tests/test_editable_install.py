"""`pip install -e .` of zoo wins over a folder named zoo in the current directory (the parent of a clone named zoo):
the editable wheel setuptools builds from pyproject.toml is one path entry (the clone's root) in a .pth file, whose
regular package Python's path search prefers to the folder's namespace package. setuptools' import hook (what a
flat layout without package-dir gets) runs after that search, and `import zoo` there gave an empty namespace
package (`module 'zoo' has no attribute 'load'`)."""

import os
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_an_editable_install_imports_zoo_beside_a_folder_named_zoo(tmp_path):
    clone = tmp_path / "clone"  # what setuptools reads to build the editable wheel, copied (the build writes there)
    clone.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(os.path.join(ROOT, name), clone / name)
    shutil.copytree(os.path.join(ROOT, "zoo"), clone / "zoo", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                    f"build_meta.build_editable({str(wheels)!r})"], cwd=clone, check=True, capture_output=True)
    site = tmp_path / "site"  # the wheel unpacked, as pip installs it into site-packages
    (wheel,) = wheels.glob("*.whl")
    zipfile.ZipFile(wheel).extractall(site)
    (pth,) = site.glob("*.pth")
    assert pth.read_text().strip() == str(clone)  # a path entry, no `import` of a finder

    user = tmp_path / "work"  # the folder a user runs Python from: it holds a clone named zoo (no __init__.py)
    (user / "zoo" / "docs").mkdir(parents=True)
    (user / "zoo" / "README.md").write_text("a clone\n")
    # -S: none of this environment's own site-packages, where the editable install of the clone under test (CI's)
    # would put its path before the wheel's; `import zoo` itself needs no package beyond the standard library.
    out = subprocess.run([sys.executable, "-S", "-c", f"import site; site.addsitedir({str(site)!r}); import zoo; "
                          "print(zoo.__file__, 'load' in zoo.__all__)"], cwd=user, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ""})
    assert out.stdout.split() == [str(clone / "zoo" / "__init__.py"), "True"], out.stderr
