"""cuda_library: compiles .cu files with nvcc through genrules into a cc_library.

nvcc runs once per .cu file and produces a position-independent object file; the
objects join a cc_library so the rest of the build links them like any C++ code.
Targets: sm_90a with PTX by default; --config=sm100 adds sm_100a. Under --config=cpu,
or when no toolkit was found, the library is empty and TESERVE_WITH_CUDA is 0
(//tools/cuda:config), so callers compile their CPU path only.
"""

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "CUDA_PATH")

_ARCH_FLAGS = "-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90a,code=compute_90a"
_SM100_FLAGS = " -gencode arch=compute_100a,code=sm_100a"

def cuda_library(name, srcs, hdrs = [], deps = [], textual_deps = [], visibility = None):
    """srcs: .cu files. hdrs: headers for C++ callers. textual_deps: headers the .cu files include."""
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        if CUDA_FOUND:
            native.genrule(
                name = obj + "_nvcc",
                srcs = [src] + hdrs + textual_deps,
                outs = [obj],
                cmd = select({
                    "//tools/cuda:sm100": "{nvcc} -std=c++17 -O3 -Xcompiler -fPIC --expt-relaxed-constexpr {arch}{sm100} -I. -I$(GENDIR) -c $(location {src}) -o $@".format(
                        nvcc = CUDA_PATH + "/bin/nvcc",
                        arch = _ARCH_FLAGS,
                        sm100 = _SM100_FLAGS,
                        src = src,
                    ),
                    "//conditions:default": "{nvcc} -std=c++17 -O3 -Xcompiler -fPIC --expt-relaxed-constexpr {arch} -I. -I$(GENDIR) -c $(location {src}) -o $@".format(
                        nvcc = CUDA_PATH + "/bin/nvcc",
                        arch = _ARCH_FLAGS,
                        src = src,
                    ),
                }),
                tags = ["manual"],
                message = "nvcc " + src,
            )
            objs.append(":" + obj)

    native.cc_library(
        name = name,
        srcs = select({
            "//tools/cuda:cpu_only": [],
            "//conditions:default": objs,
        }),
        hdrs = hdrs,
        deps = deps + select({
            "//tools/cuda:cpu_only": [],
            "//conditions:default": ["@local_cuda//:cudart"] if CUDA_FOUND else [],
        }) + ["//tools/cuda:config"],
        visibility = visibility,
    )
