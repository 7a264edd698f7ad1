"""Builds dynmo._core (and the dynmo-coordinator the package can start) with
the repository's CMake, for the interpreter that runs pip.

    pip install ./python                        # configure + build (minutes)
    DYNMO_BUILD_DIR=build pip install ./python  # reuse a configured build tree

The rest of the metadata is pyproject.toml. Needs the C++ dependencies of
scripts/install-deps.sh (Abseil, gRPC, Protobuf, nlohmann-json,
prometheus-cpp) and CMake + Ninja on PATH.
"""
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class CMakeBuild(build_ext):
    """Runs CMake for the targets dynmo_python and dynmo-coordinator."""

    def build_extension(self, ext):
        import pybind11
        build_dir = os.environ.get("DYNMO_BUILD_DIR")
        if build_dir:
            build_dir = os.path.abspath(os.path.join(ROOT, build_dir))
        else:
            build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
            os.makedirs(build_dir, exist_ok=True)
            subprocess.check_call([
                "cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja",
                "-DCMAKE_BUILD_TYPE=Release", "-DDYNMO_BUILD_TESTS=OFF",
                "-DDYNMO_BUILD_BENCH=OFF", f"-DDYNMO_PYTHON={sys.executable}",
                f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"])
        jobs = os.environ.get("DYNMO_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs, "--target",
                               "dynmo_python", "dynmo-coordinator"])
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(build_dir, "python", "dynmo", "_core" + suffix)
        if not os.path.exists(built):
            raise RuntimeError(f"{built} not built: is {build_dir} configured for "
                               f"{sys.executable} (-DDYNMO_PYTHON)?")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(built, target)
        bin_dir = os.path.join(os.path.dirname(target), "bin")
        os.makedirs(bin_dir, exist_ok=True)
        shutil.copy2(os.path.join(build_dir, "bin", "dynmo-coordinator"), bin_dir)


setup(ext_modules=[Extension("dynmo._core", sources=[])],
      cmdclass={"build_ext": CMakeBuild})
