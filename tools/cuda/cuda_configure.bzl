"""Repository rule that finds the CUDA toolkit on the build machine.

Looks at CUDA_PATH, then /usr/local/cuda. It writes @local_cuda with
  //:defs.bzl    CUDA_FOUND, CUDA_PATH (used by //tools/cuda:cuda.bzl)
  //:headers     the toolkit's include directory as a cc_library
  //:cudart      the CUDA runtime, linked dynamically with an rpath
When no toolkit is found, CUDA_FOUND is False and teserve builds its CPU backend only.
"""

def _cuda_configure_impl(repository_ctx):
    candidates = []
    env_path = repository_ctx.os.environ.get("CUDA_PATH", "")
    if env_path:
        candidates.append(env_path)
    candidates.append("/usr/local/cuda")

    cuda_path = None
    for candidate in candidates:
        if repository_ctx.path(candidate + "/bin/nvcc").exists:
            cuda_path = candidate
            break

    if cuda_path == None:
        print("teserve: no CUDA toolkit found (CUDA_PATH, /usr/local/cuda); building the CPU backend only")
        repository_ctx.file("defs.bzl", "CUDA_FOUND = False\nCUDA_PATH = \"\"\nCUDNN_FRONTEND_FOUND = False\n")
        repository_ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "headers")
cc_library(name = "cudart")
cc_library(name = "cublaslt")
cc_library(name = "cudnn_frontend")
""")
        return

    # The cuDNN frontend headers (pip package nvidia-cudnn-frontend), found the way
    # TE's build finds them. Without them the fused attention path is not built
    # (kernels/cuda/attention/cudnn_attention.cc answers UNIMPLEMENTED).
    frontend = repository_ctx.execute([
        "python3",
        "-c",
        "import importlib.metadata as m; print(m.distribution('nvidia-cudnn-frontend').locate_file('include'))",
    ])
    frontend_dir = frontend.stdout.strip() if frontend.return_code == 0 else ""
    frontend_found = bool(frontend_dir) and repository_ctx.path(frontend_dir + "/cudnn_frontend.h").exists
    if frontend_found:
        repository_ctx.symlink(frontend_dir, "cudnn_frontend_include")
        frontend_rule = """
cc_library(
    name = "cudnn_frontend",
    hdrs = glob(["cudnn_frontend_include/**/*.h", "cudnn_frontend_include/**/*.hpp"]),
    includes = ["cudnn_frontend_include"],
    deps = [":headers"],
)
"""
    else:
        print("teserve: cudnn_frontend.h not found (pip install nvidia-cudnn-frontend)")
        frontend_rule = "\ncc_library(name = \"cudnn_frontend\")\n"

    # Resolve symlinks (/usr/local/cuda -> cuda-13.0) so paths stay stable.
    real = str(repository_ctx.path(cuda_path).realpath)
    repository_ctx.symlink(real + "/include", "include")
    lib_dir = real + "/lib64"
    repository_ctx.file("defs.bzl", "CUDA_FOUND = True\nCUDA_PATH = \"%s\"\nCUDNN_FRONTEND_FOUND = %s\n" % (
        real,
        "True" if frontend_found else "False",
    ))
    repository_ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh", "include/**/*.inl"]),
    includes = ["include"],
)

cc_library(
    name = "cudart",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcudart"],
    deps = [":headers"],
)

cc_library(
    name = "cublaslt",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcublasLt", "-lcublas"],
    deps = [":headers"],
)
""".format(lib = lib_dir) + frontend_rule)

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
