"""connect(token=..., tls=...) against the real server started with bearer tokens
(--auth_tokens_file) and with TLS (--tls_cert / --tls_key, a certificate made with
openssl for the test)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import teserve


def test_tokens_map_callers_to_tenants(start_server, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("alpha-token-0123456789 alpha\nbeta-token-0123456789 beta\n")
    server = start_server(f"--auth_tokens_file={tokens}")

    with teserve.connect(server.address, token="alpha-token-0123456789") as alpha, \
            teserve.connect(server.address, token="beta-token-0123456789") as beta:
        with alpha.create_session([teserve.Linear(4, 3)], optimizer=teserve.SGD(lr=0.1)) as session:
            out = session.forward(np.ones((2, 4), dtype=np.float32), no_grad=True).output
            assert out.shape == (2, 3)
            assert [s.session_id for s in alpha.list_sessions()] == [session.id]
            # Another tenant neither sees nor reaches the session.
            assert beta.list_sessions() == []
            with pytest.raises(teserve.NotFound):
                beta.session(session.id)

    with teserve.connect(server.address) as anonymous:
        assert anonymous.health() == "SERVING"  # health stays open
        with pytest.raises(teserve.Unauthenticated) as missing:
            anonymous.list_sessions()
        assert missing.value.code == teserve.Unauthenticated.code
    with teserve.connect(server.address, token="wrong-token-0123456789") as wrong:
        with pytest.raises(teserve.Unauthenticated) as refused:
            wrong.list_sessions()
        assert "wrong-token-0123456789" not in str(refused.value)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make the test certificate")
def test_tls_with_the_servers_certificate_as_root(start_server, tmp_path: Path) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(tmp_path / "server.key"), "-out", str(tmp_path / "server.pem"), "-days", "2",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True)
    cert = str(tmp_path / "server.pem")
    server = start_server(f"--tls_cert={cert}", f"--tls_key={tmp_path / 'server.key'}", tls=cert)

    with teserve.connect(server.address, tls=cert) as client:
        info = client.server_info()
        assert info.version
        with client.create_session([teserve.Linear(4, 2)]) as session:
            assert session.forward(np.ones((1, 4), dtype=np.float32), no_grad=True).output.shape == (1, 2)
    # A plaintext client cannot talk to the TLS port.
    with teserve.connect(server.address, timeout=5) as plain:
        with pytest.raises(teserve.Unavailable):
            plain.server_info()
