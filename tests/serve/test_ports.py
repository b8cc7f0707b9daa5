"""`core.serve.ports.free_port`: a loopback port below the kernel's ephemeral range (where no outgoing connection
can take it before its server binds it), bindable when returned, never one a server holds."""

import socket

from core.serve import ports


def _range_file(tmp_path, text: str):
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    return path


def _kernel_range() -> tuple[int, int]:
    low, high = ports.EPHEMERAL_RANGE_FILE.read_text().split()
    return int(low), int(high)


def test_the_port_lies_below_the_ephemeral_range_and_binds(tmp_path):
    range_file = _range_file(tmp_path, "32768\t60999\n")
    assert ports.ephemeral_low(range_file) == 32768
    for _ in range(20):
        port = ports.free_port(range_file=range_file)
        assert ports.LOWEST_PORT <= port < 32768
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free when returned


def test_a_port_a_server_holds_is_drawn_again(tmp_path, monkeypatch):
    range_file = _range_file(tmp_path, "32768 60999")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        free = ports.free_port(range_file=range_file)  # checked free a moment ago, not a fixed number
        draws = iter([busy, busy, free])
        monkeypatch.setattr(ports._RANDOM, "randrange", lambda a, b: next(draws))
        assert ports.free_port(range_file=range_file) == free


def test_no_room_below_the_range_leaves_the_pick_to_the_kernel(tmp_path):
    range_file = _range_file(tmp_path, f"{ports.LOWEST_PORT - 5000} 60999")
    port = ports.free_port(range_file=range_file)
    low, high = _kernel_range()  # the kernel picks in its real range, whatever the file said
    assert low <= port <= high


def test_an_unreadable_range_is_the_iana_one(tmp_path):
    assert ports.ephemeral_low(tmp_path / "missing") == ports.IANA_EPHEMERAL_LOW == 49_152
    assert ports.ephemeral_low(_range_file(tmp_path, "garbage")) == 49_152
    assert ports.LOWEST_PORT <= ports.free_port(range_file=tmp_path / "missing") < 49_152
