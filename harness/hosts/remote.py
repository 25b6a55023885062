"""The remote engine: a Docker engine on another host (a headless Spark), reached over one SSH connection.

Design notes
- Docker over SSH: the Docker SDK runs over the Fabric Connection's own paramiko transport. Each HTTP connection
  of the SDK is an SSH session that execs `docker system dial-stdio` on the host (what `docker -H ssh://` does).
  Chosen over running `docker` commands through `Connection.run` because every operation of the local engine
  (containers, builds, image imports, logs, stats) then runs unchanged, with the API's structured answers rather
  than parsed CLI text; and over the SDK's own `ssh://` transport because that opens a second connection with its
  own key lookup and host-key handling, while this one is the Connection the user configured (host, user, port,
  key, known_hosts) and the one the tunnels use.
- The server's port: every HTTP connection to llama-server is a `direct-tcpip` channel on that transport to
  127.0.0.1:port on the host, i.e. an SSH tunnel (what `Connection.forward_local` opens for each accepted socket).
  llama-server stays bound to 127.0.0.1 on the host and is never exposed on the network. forward_local's own
  listener thread is not used: it dies on the first refused channel, which the /health poll causes while the
  model is still loading.
- Host keys are checked on every hop (a ProxyJump's gateway too): unknown keys are rejected (Fabric would
  accept them), known_hosts is loaded.
"""

from __future__ import annotations

import http.client
import io
import logging
import random
import re
import secrets
import shlex
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import paramiko
from docker.transport.basehttpadapter import BaseHTTPAdapter
from docker.transport.sshconn import SSHHTTPAdapter
from fabric import Connection
from invoke.exceptions import CommandTimedOut, UnexpectedExit

import docker
from harness import KitError
from harness import formatter as fm
from harness.files import file_sha256, read_bounded
from harness.formatter import console
from harness.hosts.engine import Endpoint, Engine, LocalEngine

DOCKER_API_MIN = "1.24"
#: The kit's own folder inside a host's models folder: files it sent, by sha256 (harness/hosts/remote.py).
SENT_FOLDER = ".specbench-sent"


class _QuietRefusedChannels(logging.Filter):
    """The /health poll opens channels while llama-server is not listening yet; paramiko logs each refusal."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "open FAILED" not in record.getMessage()


logging.getLogger("paramiko.transport").addFilter(_QuietRefusedChannels())
POOL_SIZE = 4


def host_label(conn: Connection) -> str:
    port = f":{conn.port}" if conn.port != 22 else ""
    return f"{conn.user}@{conn.host}{port}"


def hops(conn: Connection) -> list[Connection]:
    """The connection and every jump host in front of it (ssh config ProxyJump: Fabric's gateway chain)."""
    out, hop = [], conn
    # identity, not ==: Fabric compares connections by user, host and port, and a jump host may share them
    while isinstance(hop, Connection) and not any(hop is seen for seen in out):
        out.append(hop)
        hop = hop.gateway
    return out


def check_host_keys(conn: Connection, known_hosts: str | None = None) -> Connection:
    """Refuse unknown host keys on every hop: Fabric builds a ProxyJump's gateway with AutoAddPolicy and no
    known_hosts, so its key would be accepted unseen. A ProxyCommand is the user's own command, left as it is."""
    for hop in hops(conn):
        hop.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            hop.client.load_system_host_keys()
        except OSError:
            pass
        if known_hosts:
            try:
                hop.client.load_host_keys(str(known_hosts))
            except OSError as e:
                raise KitError(f"{conn.host}: cannot read known_hosts file {known_hosts}: {e.strerror or e}") \
                    from None
    return conn


def _hop_of(conn: Connection, server: str) -> tuple[str, int]:
    """(host, port) of the hop paramiko names as '[host]:port' or 'host' in its host-key errors."""
    host, _, port = server.removeprefix("[").partition("]:")
    for hop in hops(conn):
        if hop.host == host and (not port or int(port) == hop.port):
            return hop.host, hop.port
    return host, int(port) if port.isdigit() else 22


#: user@host[:port] or an ssh config alias; a host is a name, an IPv4 address or a bracketed IPv6 address.
_HOST_SPEC = re.compile(r"(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
                        r"(?P<host>[A-Za-z0-9_][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")


def check_host_spec(spec: str) -> None:
    """Refuse, in one line, a --host that is not user@host[:port] or an ssh config alias (Fabric would raise
    ValueError on a port that is not a number)."""
    m = _HOST_SPEC.fullmatch(spec)
    if m is None or (m.group("port") is not None and not 1 <= int(m.group("port")) <= 65535):
        raise KitError(f"--host {console(spec, 200)!r}: expected user@host[:port] with a port from 1 to 65535, or an "
                       "ssh config alias")


def open_connection(spec: str, *, port: int | None = None, key_filename: str | None = None,
                    known_hosts: str | None = None, connect_timeout: float = 15) -> Connection:
    """An open Fabric Connection to `spec` (user@host[:port] or an ssh config alias) with host keys checked on
    every hop."""
    check_host_spec(spec)
    connect_kwargs: dict[str, Any] = {}
    if key_filename:
        connect_kwargs.update(key_filename=[str(key_filename)], look_for_keys=False, allow_agent=False)
    try:
        conn = Connection(spec, port=port, connect_timeout=connect_timeout, connect_kwargs=connect_kwargs)
    except (ValueError, TypeError) as e:  # a port or HostName in ssh config that is not one
        raise KitError(f"--host {console(spec, 200)!r}: {console(e, 200)} (check it and its entry in "
                       "~/.ssh/config)") from None
    check_host_keys(conn, known_hosts)
    label = f"{conn.user}@{conn.host}:{conn.port}"
    try:
        conn.open()
    except paramiko.BadHostKeyException as e:
        host, hport = _hop_of(conn, e.hostname)
        hostport = host if hport == 22 else f"[{host}]:{hport}"
        jump = "" if host == conn.host and hport == conn.port else f" of jump host {host}:{hport}"
        raise KitError(f"{label}: host key{jump} does not match known_hosts: refusing to connect (if the host was "
                       f"reinstalled, remove its line with `ssh-keygen -R '{hostport}'` and check the new key)"
                       ) from None
    except paramiko.AuthenticationException as e:
        raise KitError(f"{label}: authentication failed ({e}); check the key (--ssh-key) and that its public part "
                       f"is in the host's authorized_keys") from None
    except paramiko.SSHException as e:
        unknown = re.search(r"Server '([^']+)' not found in known_hosts", str(e))
        if unknown:
            host, hport = _hop_of(conn, unknown.group(1))
            jump = "" if host == conn.host and hport == conn.port else f" of jump host {host}:{hport}"
            raise KitError(f"{label}: unknown host key{jump}: refusing to connect; after checking its fingerprint, "
                           f"add it with `ssh-keyscan -p {hport} {host} >> ~/.ssh/known_hosts` "
                           f"(or --known-hosts FILE)") from None
        raise KitError(f"{label}: SSH failed: {e}") from None
    except paramiko.ssh_exception.NoValidConnectionsError:
        raise KitError(f"{label}: connection refused (is sshd running and listening on port {conn.port}?)") from None
    except socket.gaierror:
        raise KitError(f"{label}: no such host: {conn.host!r} does not resolve (check the name, or its HostName "
                       "in ~/.ssh/config)") from None
    except TimeoutError:
        raise KitError(f"{label}: no answer within {fm.plain(connect_timeout)} s "
                       "(host down or port filtered?)") from None
    except OSError as e:
        raise KitError(f"{label}: cannot connect: {e.strerror or e}") from None
    return conn


class _ConnectionAdapter(SSHHTTPAdapter):
    """The Docker SDK's SSH adapter, on an already open Fabric Connection instead of a client of its own."""

    def __init__(self, conn: Connection, timeout: int):
        from docker.constants import DEFAULT_MAX_POOL_SIZE, DEFAULT_NUM_POOLS
        from docker.transport.sshconn import RecentlyUsedContainer

        self.conn = conn
        self.ssh_client = conn.client
        self.ssh_params: dict[str, Any] = {}
        self.ssh_host = conn.host
        self.timeout = timeout
        self.max_pool_size = DEFAULT_MAX_POOL_SIZE
        self.pools = RecentlyUsedContainer(DEFAULT_NUM_POOLS, dispose_func=lambda p: p.close())
        BaseHTTPAdapter.__init__(self)

    def _connect(self) -> None:
        self.conn.open()

    def get_connection(self, url, proxies=None):
        # One small pool for every URL: each pooled HTTP connection holds an SSH session open, and sshd allows
        # ten per connection (MaxSessions); the SDK's default keeps a pool per URL and runs out.
        from docker.transport.sshconn import SSHConnectionPool

        with self.pools.lock:
            pool = self.pools.get("all")
            if pool is None:
                if not self.ssh_client.get_transport():
                    self._connect()
                pool = SSHConnectionPool(ssh_client=self.ssh_client, timeout=self.timeout, maxsize=POOL_SIZE,
                                         host=self.ssh_host)
                self.pools["all"] = pool
            return pool

    def close(self) -> None:
        self.pools.clear()  # the Connection is closed by its owner


def docker_over(conn: Connection, timeout: int = 600) -> docker.DockerClient:
    """A Docker SDK client whose API calls travel over `conn` (see the module's design notes)."""
    client = docker.DockerClient(base_url="unix:///nonexistent.sock", version=DOCKER_API_MIN, timeout=timeout)
    api = client.api
    api.mount("http+docker://ssh", _ConnectionAdapter(conn, timeout))
    api.base_url = "http+docker://ssh"
    try:
        api._version = api._retrieve_server_version()
    except docker.errors.DockerException as e:
        raise KitError(f"{host_label(conn)}: no Docker engine answers over SSH ({str(e).split('(')[0].strip()}); "
                       "install Docker there and make sure this user may use it (group docker)") from None
    return client


class _ChannelRaw(io.RawIOBase):
    def __init__(self, channel: paramiko.Channel):
        self.channel = channel

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.channel.recv(len(b))
        b[: len(data)] = data
        return len(data)


class _ChannelSocket:
    """The part of a socket http.client uses, over a paramiko channel (whose own file object cannot peek)."""

    def __init__(self, channel: paramiko.Channel):
        self.channel = channel

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_ChannelRaw(self.channel))

    def sendall(self, data: bytes) -> None:
        self.channel.sendall(data)

    def settimeout(self, timeout: float | None) -> None:
        self.channel.settimeout(timeout)

    def close(self) -> None:
        self.channel.close()


class _ChannelHTTPConnection(http.client.HTTPConnection):
    """HTTP over a direct-tcpip channel to 127.0.0.1:port on the remote host."""

    def __init__(self, endpoint: TunnelEndpoint, timeout: float):
        super().__init__("127.0.0.1", endpoint.port, timeout=timeout)
        self._endpoint = endpoint

    def connect(self) -> None:
        transport = self._endpoint.conn.transport
        if transport is None or not transport.is_active():
            raise ConnectionError("the SSH connection is down")
        channel = transport.open_channel("direct-tcpip", ("127.0.0.1", self._endpoint.port), ("127.0.0.1", 0),
                                         timeout=self.timeout)
        channel.settimeout(self.timeout)
        self._endpoint.channels += 1
        self.sock = _ChannelSocket(channel)


class TunnelEndpoint(Endpoint):
    via = "ssh-tunnel"

    def __init__(self, conn: Connection, port: int):
        super().__init__(port)
        self.conn = conn
        #: direct-tcpip channels opened to the server (health polls and requests), for tests and diagnostics.
        self.channels = 0

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        return _ChannelHTTPConnection(self, timeout)


class RemoteEngine(Engine):
    """A Docker engine on the host at the other end of a Fabric Connection (Engine's operations over SSH).

    Long by design: Engine's operations that need the host (commands, files, ports, models) over the connection."""

    remote = True
    transient_errors = (paramiko.ChannelException, paramiko.SSHException, EOFError)
    lost_errors = (*Engine.lost_errors, paramiko.SSHException)

    def __init__(self, conn: Connection, label: str | None = None, remote_models: str | None = None):
        self.conn = conn
        self.name = label or host_label(conn)
        super().__init__(docker_over(conn))
        self._models_dir = remote_models
        #: every server endpoint handed out, so a run can show its servers were reached only through the tunnel.
        self.endpoints: list[TunnelEndpoint] = []

    @classmethod
    def connect(cls, spec: str, **kwargs: Any) -> RemoteEngine:
        remote_models = kwargs.pop("remote_models", None)
        label = kwargs.pop("label", None)
        return cls(open_connection(spec, **kwargs), label=label or spec, remote_models=remote_models)

    # -- host commands
    def run_host(self, argv: list[str], timeout: float = 20) -> tuple[int, str]:
        try:
            res = self.conn.run(shlex.join(argv), hide=True, warn=True, timeout=timeout, in_stream=False)
        except CommandTimedOut:
            return 124, ""
        except UnexpectedExit as e:
            return e.result.exited, e.result.stdout
        return res.exited, res.stdout

    def read_host_file(self, path: str) -> str | None:
        code, out = self.run_host(["cat", path])
        return out if code == 0 else None

    def hostname(self) -> str:
        code, out = self.run_host(["hostname"])
        return out.strip() if code == 0 else self.conn.host

    def free_port(self) -> int:
        code, out = self.run_host(["python3", "-c", "import socket; s = socket.socket(); "
                                   "s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"])
        if code == 0 and out.strip().isdigit():
            return int(out.strip())
        code, out = self.run_host(["ss", "-ltnH"])
        used = {int(p.rsplit(":", 1)[1]) for p in (ln.split()[3] for ln in out.splitlines() if len(ln.split()) > 3)
                if p.rsplit(":", 1)[1].isdigit()} if code == 0 else set()
        while True:
            port = random.randrange(20000, 60000)
            if port not in used:
                return port

    def endpoint(self, port: int) -> TunnelEndpoint:
        ep = TunnelEndpoint(self.conn, port)
        self.endpoints.append(ep)
        return ep

    # -- models on the host
    def models_dir(self) -> str:
        if self._models_dir is None:
            code, out = self.run_host(["sh", "-c", "echo $HOME"])
            self._models_dir = f"{out.strip() or '/tmp'}/specbench/models"
        return self._models_dir

    def read_head(self, path: Path, n: int) -> bytes:
        """The first n bytes of a file on the host, as bytes (an exec channel: Fabric's run decodes text)."""
        transport = self.conn.transport
        if transport is None or not transport.is_active():
            raise KitError(f"{self.name}: the SSH connection is down")
        chan = transport.open_session(timeout=30)
        try:
            chan.exec_command(shlex.join(["head", "-c", str(int(n)), str(path)]))
            chunks = list(read_bounded(chan.recv, n))
            if chan.recv_exit_status() != 0 and not chunks:
                raise KitError(f"{self.name}: cannot read {path}")
            return b"".join(chunks)
        finally:
            chan.close()

    def remote_sha256(self, path: str) -> str | None:
        code, out = self.run_host(["sha256sum", path], timeout=3600)
        return out.split()[0] if code == 0 and out.strip() else None

    def send_chunks(self, chunks: Iterable[bytes], remote: str) -> None:
        """Write bytes to a file on the host through an SSH exec channel (`cat > file`): no SFTP subsystem needed,
        which hardened sshd configurations often leave out."""
        transport = self.conn.transport
        if transport is None or not transport.is_active():
            raise KitError(f"{self.name}: the SSH connection is down; run the task again")
        try:
            channel = transport.open_session(timeout=30)
            # noclobber: the file must be new; an existing file or a link planted there is never written through
            channel.exec_command(shlex.join(["sh", "-c", 'set -C && exec cat > "$1"', "sh", remote]))
            for chunk in chunks:
                channel.sendall(chunk)
            channel.shutdown_write()
            code = channel.recv_exit_status()
            err = channel.recv_stderr(4096).decode("utf-8", "replace").strip()
            channel.close()
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise KitError(f"{self.name}: cannot send files over SSH ({e or type(e).__name__}): the kit writes "
                           "them with `cat` on an SSH exec channel; allow command execution for this user "
                           "(no ForceCommand or restricted shell)") from None
        if code != 0:
            raise KitError(f"{self.name}: cannot write {remote} ({err.splitlines()[-1] if err else f'exit {code}'});"
                           " choose a folder this user may write with --remote-models")

    def send_bytes(self, data: bytes, remote: str) -> None:
        self.send_chunks([data], remote)

    def send_file(self, path: Path, remote: str, chunk: int = 1 << 20) -> None:
        def read():
            with open(path, "rb") as f:
                while block := f.read(chunk):
                    yield block

        self.send_chunks(read(), remote)

    def _describe(self, path: str) -> str:
        """'17.5 GB, owner me, sha256 0123456789ab' of a file on the host (for a refusal that names it)."""
        code, out = self.run_host(["stat", "-L", "-c", "%s %U", "--", path])
        size, _, owner = out.strip().partition(" ")
        have = self.remote_sha256(path)
        what = f"{fm.num(int(size) / 1e9, 2)} GB" if code == 0 and size.isdigit() else "size unknown"
        return f"{what}, owner {console(owner or '?', 64)}" + (f", sha256 {have[:12]}" if have else "")

    def place_models(self, local: dict[str, Path], log, upload_limit: int = 2 << 30) -> dict[str, Path]:
        """Model files on the host, sha256-checked, never overwriting a file the kit did not place.

        A file of the same name in the host's models folder (the user's, e.g. from `invoke models` there) is used
        when its sha256 matches. Otherwise the kit uses, or sends (over the SSH exec channel, when small enough),
        a copy in its own content-addressed folder `<models>/.specbench-sent/<sha256>/<name>`: a manifest that
        names the user's file with other bytes gets a file of its own, and the user's stays as it is."""
        folder = self.models_dir()
        code, _ = self.run_host(["mkdir", "-p", "--", folder])
        if code != 0:
            raise KitError(f"{self.name}: cannot make the models folder {folder}; choose one this user may write "
                           "with --remote-models")
        code, _ = self.run_host(["sh", "-c", "command -v sha256sum && command -v mktemp"])
        if code != 0:
            raise KitError(f"{self.name}: sha256sum or mktemp is missing there (coreutils); install it to check "
                           "model files")
        out: dict[str, Path] = {}
        for key, path in local.items():
            want = file_sha256(path)
            users = f"{folder}/{path.name}"
            sent = f"{folder}/{SENT_FOLDER}/{want}/{path.name}"
            theirs = self.remote_sha256(users)
            if theirs == want:
                out[key] = Path(users)
                continue
            self._no_links([f"{folder}/{SENT_FOLDER}", f"{folder}/{SENT_FOLDER}/{want}", sent])
            if self.remote_sha256(sent) != want:
                size = path.stat().st_size
                other = "" if theirs is None else \
                    f"; {users} holds other bytes ({self._describe(users)}), left as it is"
                if size > upload_limit:
                    place = users if theirs is None else sent
                    raise KitError(f"{self.name}: models.{key}: {path.name} ({fm.fixed(size / 1e9, 1)} GB, sha256 "
                                   f"{want[:12]}) is not there{other}; it is too large to send over SSH: copy it "
                                   f"to {place} (scp), or make it there with `invoke models`")
                log(f"{self.name}: sending {path.name} ({fm.fixed(size / 1e6, 1)} MB) to {sent}" + other)
                self._send_new(path, sent)
                if self.remote_sha256(sent) != want:
                    raise KitError(f"{self.name}: {sent} has a different sha256 after sending it")
            out[key] = Path(sent)
        return out

    def _no_links(self, paths: list[str]) -> None:
        """The kit's own folder holds only what the kit placed: a link anywhere on the way to a file it reads or
        writes there (planted by someone with access to the host) is refused, never followed."""
        code, out = self.run_host(["sh", "-c", 'for p in "$@"; do if [ -L "$p" ]; then echo "$p"; exit 3; fi; done',
                                   "sh", *paths])
        if code == 3:
            raise KitError(f"{self.name}: {console(out.strip(), 300)} is a symbolic link; the kit's folder "
                           f"{SENT_FOLDER} holds only files and folders it made: remove the link there")
        if code != 0:
            raise KitError(f"{self.name}: cannot look at {console(paths[-1], 300)} (exit {code})")

    def _send_new(self, path: Path, remote: str) -> None:
        """Send a file into the kit's own folder: written to a new file that only this call creates (noclobber,
        so no link or file already there is written through), then renamed over `remote` (`mv -T`: never into a
        folder of that name)."""
        folder = remote.rsplit("/", 1)[0]
        code, _ = self.run_host(["mkdir", "-p", "--", folder])
        if code != 0:
            raise KitError(f"{self.name}: cannot make {folder}; choose a models folder this user may write with "
                           "--remote-models")
        self._no_links([folder.rsplit("/", 1)[0], folder, remote])  # made by mkdir, or planted before it ran
        partial = f"{remote}.partial-{secrets.token_hex(6)}"
        try:
            self.send_file(path, partial)
            code, _ = self.run_host(["mv", "-T", "-f", "--", partial, remote])
            if code != 0:
                raise KitError(f"{self.name}: cannot move {partial} to {remote}")
        finally:
            self.run_host(["rm", "-f", "--", partial])

    def close(self) -> None:
        super().close()
        self.conn.close()


def engines_for(hosts: list[str] | None, *, ssh_key: str | None = None, known_hosts: str | None = None,
                remote_models: str | None = None) -> list[Engine]:
    """Engines for the named hosts ('local' or user@host[:port]); the local engine when none is named."""
    if not hosts:
        return [LocalEngine()]
    engines: list[Engine] = []
    try:
        for spec in dict.fromkeys(hosts):
            if spec == "local":
                engines.append(LocalEngine())
            else:
                engines.append(RemoteEngine.connect(spec, key_filename=ssh_key, known_hosts=known_hosts,
                                                    remote_models=remote_models))
    except KitError:
        for e in engines:
            e.close()
        raise
    return engines
