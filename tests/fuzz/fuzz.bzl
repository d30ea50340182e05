"""teserve_fuzz_test: one libFuzzer target, built two ways from the same sources.

`bazel test //tests/fuzz/...` (the normal gcc build, part of `bazel test //...`): the
target links replay_main.cc and runs every file of its corpus once, so the seeds and
every input that once crashed a fuzzer stay regression tests without clang.

`bazel build --config=fuzz //tests/fuzz/...` (clang, .bazelrc): the target links
libFuzzer (-fsanitize=fuzzer) with AddressSanitizer and UndefinedBehaviorSanitizer;
tests/fuzz/run_fuzzers.sh builds and runs it (docs/fuzzing.md).
"""

def teserve_fuzz_test(name, srcs, deps, size = "small", dictionary = None):
    """name: the target, its corpus is corpus/<name>/ (checked in). srcs: defines
    LLVMFuzzerTestOneInput (and optionally LLVMFuzzerInitialize)."""
    corpus = name + "_corpus"
    native.filegroup(
        name = corpus,
        srcs = native.glob(["corpus/%s/*" % name]),
    )
    native.cc_test(
        name = name,
        size = size,
        srcs = srcs,
        args = ["$(locations :%s)" % corpus],
        data = [":" + corpus] + ([dictionary] if dictionary else []),
        deps = deps + select({
            ":libfuzzer": [],
            "//conditions:default": [":replay_main"],
        }),
        linkopts = select({
            ":libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
