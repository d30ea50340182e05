"""teserve_proto_library: protoc + grpc_cpp_plugin through a genrule, then a cc_library.

Uses the system's protoc and grpc_cpp_plugin (protobuf-compiler-grpc), so the build stays
offline. Generated headers are included as "teserve/v1/<name>.pb.h".
"""

def teserve_proto_library(name, srcs, deps = [], visibility = None):
    """srcs: .proto files under <package>/teserve/v1/. grpc_cpp_plugin writes a (possibly
    empty) .grpc.pb.{h,cc} pair for every file, so all four outputs are declared."""
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc", base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    native.genrule(
        name = name + "_gen",
        srcs = srcs,
        outs = outs,
        cmd = " ".join([
            "protoc --proto_path=" + native.package_name(),
            "--cpp_out=$(RULEDIR)",
            "--grpc_out=$(RULEDIR)",
            "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin)",
            "$(SRCS)",
        ]),
        message = "protoc " + name,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = ["."],
        deps = deps,
        visibility = visibility,
    )
