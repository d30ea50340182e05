"""Generated protobuf and gRPC modules of the wire contract proto/teserve/v1.

Written by tools/gen_py_stubs.sh; do not edit. CI checks that they match proto/.
"""
