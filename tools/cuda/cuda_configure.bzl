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
        repository_ctx.file("defs.bzl", "CUDA_FOUND = False\nCUDA_PATH = \"\"\n")
        repository_ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "headers")
cc_library(name = "cudart")
cc_library(name = "cublaslt")
""")
        return

    # Resolve symlinks (/usr/local/cuda -> cuda-13.0) so paths stay stable.
    real = str(repository_ctx.path(cuda_path).realpath)
    repository_ctx.symlink(real + "/include", "include")
    lib_dir = real + "/lib64"
    repository_ctx.file("defs.bzl", "CUDA_FOUND = True\nCUDA_PATH = \"%s\"\n" % real)
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
""".format(lib = lib_dir))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
