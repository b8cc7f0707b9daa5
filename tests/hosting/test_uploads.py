"""Hostile uploads for each of the three upload kinds (a serving trace, a config.json, a safetensors index), read
the way the pages read them: empty, binary, 50 MB, wrong columns / fields, negative lengths, lengths above the
model limit, 10^6 rows, zip / gzip / other archive bombs, JSON nesting bombs. Each is refused with a typed error
naming what was wrong, and nothing is returned."""

import bz2
import gzip
import io
import json
import lzma
import struct
import tracemalloc
import zipfile
import zlib

import pytest

from core.errors import InvalidArgumentError, LabError, LimitExceededError
from core.limits import Limits
from core.page_models.planner import config_from_bytes, config_from_text, model_from_config
from core.planning.catalog.models import preset_configs
from core.planning.catalog.weights import read_safetensors_index
from core.serving.workload import Request, load_trace
from core.uploads import archive_kind, parse_json, read_upload, upload_text

LIMITS = Limits()  # the defaults: 25,000,000 upload bytes, 10,000 requests
HEADER = "arrival_time,prompt_len,output_len\n"
MiB = 2**20


def read_trace(file, limits=LIMITS):
    return load_trace(file, max_len=2048, max_len_source="OPT-13B", limits=limits)


def read_config(file, limits=LIMITS):
    """As the Planner page does: the upload limit, then the config.json, then the model it describes."""
    config = config_from_bytes(read_upload(file, "the uploaded config.json", limits))
    model_from_config(config)
    return config


def read_index(file, limits=LIMITS):
    return read_safetensors_index(read_upload(file, "the safetensors index", limits))


READERS = {"trace": read_trace, "config": read_config, "index": read_index}
GOOD = {
    "trace": (HEADER + "0.5,10,3\n0,20,4\n").encode(),
    "config": json.dumps(preset_configs()["mistral-7b"]["config"]).encode(),
    "index": b'{"metadata": {"total_size": 14483464192}, "weight_map": {"lm_head.weight": "a.safetensors"}}',
}


def test_good_uploads_of_each_kind_are_read():
    assert read_trace(GOOD["trace"]) == [Request(0, 0.0, 20, 4), Request(1, 0.5, 10, 3)]
    assert read_config(GOOD["config"])["num_hidden_layers"] == 32
    assert read_index(GOOD["index"]) == 14_483_464_192


class SizedUpload:
    """Like a Streamlit UploadedFile: `size` known up front. Reading it fails the test: the size check must come
    first."""

    def __init__(self, size: int):
        self.size = size

    def read(self, *args):
        raise AssertionError("the file was read before its size was checked")

    getvalue = read


@pytest.mark.parametrize("kind", READERS)
def test_50_mb_upload_is_refused_before_reading(kind):
    with pytest.raises(
        LimitExceededError, match=r"50,000,000 bytes.*25,000,000.*PAGED_LAB_MAX_UPLOAD_BYTES"
    ) as e:
        READERS[kind](SizedUpload(50_000_000))
    assert e.value.variable == "PAGED_LAB_MAX_UPLOAD_BYTES"
    READERS[kind](io.BytesIO(GOOD[kind]))  # the same path with a small file works


@pytest.fixture(scope="module")
def fifty_mb():
    return b" " * 50_000_000  # allocated once for the whole module


@pytest.mark.parametrize("kind", READERS)
def test_50_mb_bytes_and_file_objects_are_refused(kind, fifty_mb):
    for file in (fifty_mb, io.BytesIO(fifty_mb)):
        with pytest.raises(LimitExceededError, match="PAGED_LAB_MAX_UPLOAD_BYTES"):
            READERS[kind](file)


def test_50_mb_trace_on_disk_is_refused_from_its_size(tmp_path):
    path = tmp_path / "trace.csv"
    with open(path, "wb") as f:
        f.truncate(50_000_000)  # a sparse file: nothing allocated
    with pytest.raises(LimitExceededError, match=r"50,000,000 bytes"):
        read_trace(path)
    with pytest.raises(LimitExceededError, match=r"50,000,000 bytes"):
        read_trace(str(path))


def test_stream_of_unknown_size_is_read_at_most_one_byte_past_the_limit():
    class Stream(io.RawIOBase):
        def __init__(self):
            self.asked = []

        def readable(self):
            return True

        def read(self, size=-1):
            self.asked.append(size)
            return b"x" * size

    stream = Stream()
    with pytest.raises(LimitExceededError, match=r"more than 100 bytes.*PAGED_LAB_MAX_UPLOAD_BYTES"):
        read_upload(stream, "the trace", Limits(max_upload_bytes=100))
    assert stream.asked == [101]


def test_seekable_file_is_measured_from_its_position():
    file = io.BufferedReader(io.BytesIO(b"x" * 150))
    file.seek(60)  # 90 bytes left
    assert read_upload(file, "f", Limits(max_upload_bytes=90)) == b"x" * 90
    file.seek(59)
    with pytest.raises(LimitExceededError, match="91 bytes"):
        read_upload(file, "f", Limits(max_upload_bytes=90))


@pytest.mark.parametrize("kind", READERS)
@pytest.mark.parametrize("data", [b"", b"   \n\t\n", b"\xef\xbb\xbf"])
def test_empty_upload_is_refused(kind, data):
    with pytest.raises(InvalidArgumentError, match="is empty"):
        READERS[kind](data)


@pytest.mark.parametrize("kind", READERS)
@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", r"binary \(a NUL byte at byte 8\)"),
        (b'{"a": 1}\x00', r"binary \(a NUL byte at byte 8\)"),
        (b"arrival_time\xc3\x28", r"not UTF-8 text \(byte 12\)"),
        ("arrival_time,prompt_len".encode("utf-16"), "UTF-16"),
    ],
)
def test_binary_upload_is_refused(kind, data, reason):
    with pytest.raises(InvalidArgumentError, match=reason):
        READERS[kind](data)


# ---- archives: recognised by their magic bytes, never decompressed ------------------------------------------


def gzip_bomb(members: int = 1024) -> bytes:
    """`members` gzip members of 1 MiB of zeros each, concatenated (a valid gzip file): ~1 MB expanding to 1 GiB."""
    return gzip.compress(b"\0" * MiB, 9) * members


def zip_bomb(entries: int = 1024) -> bytes:
    """A zip of `entries` files of 1 MiB of zeros each sharing one deflate stream: ~1 MB expanding to 1 GiB."""
    payload = b"\0" * MiB
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    deflated = packer.compress(payload) + packer.flush()
    crc = zlib.crc32(payload)
    local, central, offset = [], [], 0
    for i in range(entries):
        name = f"trace{i}.csv".encode()
        fields = (20, 0, 8, 0, 0, crc, len(deflated), MiB, len(name), 0)
        header = struct.pack("<4s5H3L2H", b"PK\x03\x04", *fields) + name
        central.append(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, *fields, 0, 0, 0, 0, offset) + name)
        local.append(header + deflated)
        offset += len(header) + len(deflated)
    directory = b"".join(central)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, entries, entries, len(directory), offset, 0)
    return b"".join(local) + directory + end


@pytest.fixture(scope="module")
def bombs():
    return {"gzip": gzip_bomb(), "zip": zip_bomb()}


def test_the_bombs_are_real(bombs):
    """Independent check with the standard library: each really expands to 1 GiB (checked on one member)."""
    assert len(bombs["gzip"]) < 2 * MiB and len(bombs["zip"]) < 2 * MiB
    with zipfile.ZipFile(io.BytesIO(bombs["zip"])) as archive:
        infos = archive.infolist()
        assert sum(i.file_size for i in infos) == 1024 * MiB
        assert archive.read(infos[-1]) == b"\0" * MiB
    member = len(bombs["gzip"]) // 1024
    assert gzip.decompress(bombs["gzip"][:member]) == b"\0" * MiB


@pytest.mark.parametrize("kind", READERS)
@pytest.mark.parametrize("archive", ["gzip", "zip"])
def test_zip_and_gzip_bombs_are_refused_without_expanding(kind, archive, bombs):
    data = bombs[archive]
    tracemalloc.start()
    try:
        with pytest.raises(
            InvalidArgumentError, match=f"a {archive} compressed archive: upload the uncompressed"
        ):
            READERS[kind](data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MiB, peak  # the 1 MB bomb may be copied once; 1 GiB is never expanded


OTHER_ARCHIVES = {
    "bzip2": bz2.compress(GOOD["trace"]),
    "xz": lzma.compress(GOOD["trace"]),
    "zlib": zlib.compress(GOOD["trace"]),
    "zstd": b"\x28\xb5\x2f\xfd" + b"\x00" * 16,  # a zstd frame header
    "7z": b"7z\xbc\xaf\x27\x1c\x00\x04",
}


@pytest.mark.parametrize("kind", READERS)
@pytest.mark.parametrize("archive", OTHER_ARCHIVES)
def test_other_archives_are_refused(kind, archive):
    with pytest.raises(InvalidArgumentError, match=f"a {archive} compressed archive"):
        READERS[kind](OTHER_ARCHIVES[archive])


def test_tar_and_plain_text_are_told_apart():
    tar = io.BytesIO()
    import tarfile

    with tarfile.open(fileobj=tar, mode="w") as archive:
        info = tarfile.TarInfo("trace.csv")
        info.size = len(GOOD["trace"])
        archive.addfile(info, io.BytesIO(GOOD["trace"]))
    assert archive_kind(tar.getvalue()) == "tar"
    for text in (GOOD["trace"], GOOD["config"], GOOD["index"], b"PK", b"x"):
        assert archive_kind(text) is None


# ---- JSON nesting bombs ------------------------------------------------------------------------------------

NESTING_BOMBS = ["[" * 100_000, "[" * 50_000 + "]" * 50_000, '{"a":' * 30_000]  # under 200,000 chars


@pytest.mark.parametrize("kind", ["config", "index"])
@pytest.mark.parametrize("bomb", NESTING_BOMBS, ids=["open", "closed", "objects"])
def test_json_nesting_bomb_is_a_typed_error(kind, bomb):
    with pytest.raises(InvalidArgumentError, match="nested too deeply"):
        READERS[kind](bomb.encode())


def test_json_nesting_bomb_in_pasted_text_and_in_a_trace_line():
    with pytest.raises(InvalidArgumentError, match="nested too deeply"):
        config_from_text('{"a":' * 30_000)
    with pytest.raises(InvalidArgumentError, match="nested too deeply"):
        read_safetensors_index("[" * 100_000)
    line = '{"arrival_time": 0, "prompt_len": 5, "output_len": 5}\n'
    with pytest.raises(InvalidArgumentError, match="trace line 2: cannot be read"):
        read_trace((line + '{"a": ' + "[" * 30_000 + "\n").encode())


def test_parse_json_reports_position_and_long_integers():
    with pytest.raises(InvalidArgumentError, match=r"x is not valid JSON: .*line 2 column 1"):
        parse_json('{"a": 1,\n}', "x")
    with pytest.raises(InvalidArgumentError, match="x cannot be read"):
        parse_json('{"a": ' + "9" * 5000 + "}", "x")
    assert parse_json(b'{"a": [1, 2]}', "x") == {"a": [1, 2]}


# ---- wrong columns and fields, negative lengths, the model limit ---------------------------------------------


@pytest.mark.parametrize(
    ("kind", "data", "reason"),
    [
        (
            "trace",
            "time,input,output\n0,5,5\n",
            r"lacks column\(s\) \['arrival_time', 'prompt_len', 'output_len'\]",
        ),
        ("trace", "0,5,5\n1,6,6\n", r"lacks column.*the first row must name the columns"),
        ("trace", HEADER + "0,5\n", r"row 2: missing column 'output_len'"),
        ("trace", HEADER + "0,5,5,7\n", r"row 2: 4 fields, but the header names 3 columns"),
        (
            "trace",
            '{"arrival_time": 0, "prompt": 5, "output_len": 5}\n',
            r"row 1: missing column 'prompt_len'",
        ),
        ("trace", '[{"arrival_time": 0, "prompt_len": 5, "output_len": 5}]', "JSON array: upload JSON lines"),
        ("trace", '{\n"arrival_time": 0}\n', "line 1: not valid JSON.*one JSON object per line"),
        ("trace", HEADER + '0,"5\n', "not valid CSV"),
        ("config", '{"model_type": "llama", "hidden_size": 4096}', "lacks the number of"),
        ("config", '{"layers": 32}', "lacks the"),
        ("config", "[1, 2]", "JSON object"),
        ("index", '{"weight_map": {"a": "b.safetensors"}}', "needs metadata.total_size"),
        ("index", '{"metadata": {"total_size": "14 GB"}}', "needs metadata.total_size"),
    ],
)
def test_wrong_columns_or_fields_are_named(kind, data, reason):
    with pytest.raises(InvalidArgumentError, match=reason):
        READERS[kind](data.encode())


def test_long_lines_are_refused_before_they_are_parsed():
    """No row is parsed from a line over 65,536 characters, so none can expand into thousands of fields or keys."""
    cases = {
        HEADER
        + "0,5,"
        + "9" * 200_000
        + "\n": "line 2 has 200,004 characters; a row may have at most 65,536",
        ",".join(f"c{i}" for i in range(20_000)) + "\n": "line 1 has 128,889 characters",
        "{" + ",".join(f'"k{i}": 0' for i in range(10_000)) + "}\n": "line 1 has 108,891 characters",
        HEADER + '0,5,5,"' + "x\n" * 70_000 + '"\n': "not valid CSV",  # one field over csv's 131,072
    }
    for text, reason in cases.items():
        with pytest.raises(InvalidArgumentError, match=reason):
            read_trace(text.encode())
    assert len(read_trace((HEADER + "0,5," + "0" * 65_531 + "5\n").encode())) == 1  # 65,536: at the bound
    with pytest.raises(InvalidArgumentError, match="line 2 has 65,537 characters"):
        read_trace((HEADER + "0,5," + "0" * 65_532 + "5\n").encode())
    with pytest.raises(
        InvalidArgumentError, match="line 2 has 65,537 characters"
    ):  # a last line without "\n"
        read_trace((HEADER + "0,5," + "0" * 65_532 + "5").encode())


@pytest.mark.parametrize(
    ("kind", "data", "reason"),
    [
        ("trace", HEADER + "0,-5,5\n", r"row 2, column 'prompt_len': expected an integer >= 1, got -5"),
        ("trace", HEADER + "0,5,5\n1,5,0\n", r"row 3, column 'output_len': expected an integer >= 1, got 0"),
        ("trace", HEADER + "0,5,2.5\n", r"row 2, column 'output_len'"),
        ("trace", HEADER + "-0.1,5,5\n", r"row 2, column 'arrival_time'"),
        ("trace", HEADER + "nan,5,5\n", r"row 2, column 'arrival_time'"),
        ("trace", HEADER + "0,1e400,5\n", r"row 2, column 'prompt_len'"),
        ("trace", '{"arrival_time": 0, "prompt_len": true, "output_len": 5}', r"row 1, column 'prompt_len'"),
        (
            "trace",
            '{"arrival_time": 0, "prompt_len": 5, "output_len": -3}',
            r"row 1, column 'output_len'.*-3",
        ),
        ("config", json.dumps({**preset_configs()["mistral-7b"]["config"], "num_hidden_layers": -1}), "-1"),
        ("index", '{"metadata": {"total_size": -5}}', "positive number of bytes; got -5"),
        ("index", '{"metadata": {"total_size": 0}}', "got 0"),
    ],
)
def test_negative_zero_and_non_integer_lengths_are_refused(kind, data, reason):
    with pytest.raises(InvalidArgumentError, match=reason):
        READERS[kind](data.encode())


def test_trace_rows_above_the_model_limit_name_the_row_and_the_limit():
    # 2,000 + 48 = 2,048 tokens fits OPT-13B's 2,048 exactly; 2,000 + 49 does not
    assert read_trace(HEADER + "0,2000,48\n")[0].max_total_len == 2048
    message = r"trace row 3: prompt_len 2,000 \+ output_len 49 = 2,049 tokens, over the limit of 2,048 tokens \(OPT-13B\)"
    with pytest.raises(InvalidArgumentError, match=message):
        read_trace(HEADER + "0,10,10\n1,2000,49\n")
    with pytest.raises(InvalidArgumentError, match="trace row 1: prompt_len 4,096"):
        load_trace('{"arrival_time": 0, "prompt_len": 4096, "output_len": 1}', max_len=4096, limits=LIMITS)
    assert len(load_trace(HEADER + "0,4000,96\n", max_len=4096, limits=LIMITS)) == 1
    assert len(load_trace(HEADER + "0,4000,96\n", limits=LIMITS)) == 1  # no model limit given


def test_huge_index_total_size_is_refused():
    with pytest.raises(InvalidArgumentError, match="a positive number of bytes"):
        read_index(json.dumps({"metadata": {"total_size": 2**50}}).encode())
    assert read_index(json.dumps({"metadata": {"total_size": 2**50 - 1}}).encode()) == 2**50 - 1


# ---- 10^6 rows -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_million_row_trace_stops_at_the_first_row_over_the_request_limit(fmt):
    """10^6 rows, row 500,000 malformed: had reading gone on past the limit, that row's error would be raised."""
    if fmt == "csv":
        rows = [b"0,5,5\n"] * 1_000_000
        rows[500_000] = b"0,not-a-number,5\n"
        data, where = HEADER.encode() + b"".join(rows), "row 10,002"  # header = row 1
    else:
        rows = [b'{"arrival_time":0,"prompt_len":5,"output_len":5}\n'] * 1_000_000
        rows[500_000] = b'{"arrival_time":0}\n'
        data, where = b"".join(rows), "row 10,001"
    limits = Limits(max_upload_bytes=len(data))  # the row limit is what refuses it, not the byte limit
    message = rf"more than 10,000 requests \(reading stopped at {where}\)"
    tracemalloc.start()
    try:
        with pytest.raises(LimitExceededError, match=message) as e:
            read_trace(data, limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(data) + 4 * MiB, peak  # one decoded copy of the file and 10,001 rows: no list of lines
    assert e.value.variable == "PAGED_LAB_MAX_REQUESTS" and "PAGED_LAB_MAX_REQUESTS" in str(e.value)
    first = (HEADER.encode() if fmt == "csv" else b"") + b"".join(rows[:10_000])
    assert len(read_trace(first, limits)) == 10_000  # exactly at the limit: accepted


def test_the_request_limit_is_inclusive_and_follows_the_operator():
    limits = Limits(max_simulated_requests=3)
    assert len(read_trace(HEADER + "0,5,5\n" * 3, limits)) == 3
    with pytest.raises(LimitExceededError, match=r"more than 3 requests \(reading stopped at row 5\)"):
        read_trace(HEADER + "0,5,5\n" * 4, limits)
    limits.check_rows_read(3, "row 4")
    with pytest.raises(LimitExceededError, match="PAGED_LAB_MAX_REQUESTS"):
        limits.check_rows_read(4, "row 5")


def test_the_request_limit_comes_from_the_environment_by_default(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MAX_REQUESTS", "2")
    with pytest.raises(LimitExceededError, match="more than 2 requests"):
        load_trace(HEADER + "0,5,5\n" * 3)


def test_a_million_entry_index_within_the_byte_limit_is_read():
    entries = ",".join(f'"w{i}":"s"' for i in range(1_000_000))
    data = ('{"metadata": {"total_size": 123456}, "weight_map": {' + entries + "}}").encode()
    assert 10_000_000 < len(data) < LIMITS.max_upload_bytes
    assert read_index(data) == 123_456
    with pytest.raises(LimitExceededError, match="PAGED_LAB_MAX_UPLOAD_BYTES"):
        read_index(data, Limits(max_upload_bytes=10_000_000))


def test_a_million_field_config_is_refused_by_its_size():
    data = b'{"k": 0, ' * 1_000_000 + b'"k": 0}'  # 9 MB: under the upload limit, over a config.json's bound
    with pytest.raises(InvalidArgumentError, match=r"a Hugging Face config.json of at most 800,000 bytes"):
        read_config(data)


def test_errors_are_lab_errors_and_upload_text_keeps_good_text():
    assert issubclass(LimitExceededError, LabError) and issubclass(InvalidArgumentError, LabError)
    assert upload_text("\ufeffa,b\nçé\n".encode(), "x", "y") == "a,b\nçé\n"
