"""`cadence doctor`'s reports: the Chrome/Perfetto trace
(`--trace`), the self-contained HTML page (`--html`, rendered in headless
Chromium), the exclusion list (`--exclude-file`) and one-line errors for
outputs that cannot be written — on synthetic dumps (built with
tests/test_diagnosis.py's helpers, clock offsets included) and on the dumps
of a real job where a rank never enters a collective."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from cadence.cli.main import main as cli
from cadence.diagnosis import diagnose, load_dir, parse, report_html, trace
from cadence.diagnosis.exclude import exclusion_hosts
from harness import run_ranks
from test_diagnosis import (
    _frozen_dumps,
    _link_down_dumps,
    done_before,
    dump,
    msg,
    op,
    ring_fail,
)

HOSTS4 = {0: "h0", 1: "h1", 2: "h2", 3: "h3"}.get


def write_dir(path, dumps, counters=True):
    """Writes dumps as a rank would (`cadence-<comm>-rank<r>.json`), with
    link counters unless told not to."""
    path.mkdir(parents=True, exist_ok=True)
    for d in dumps:
        if counters:
            d["links"] = [{"peer": p, "transport": "tcp", "bytes_sent": 4096 * (p + 1),
                           "bytes_recv": 4096 * (d["rank"] + 1), "msgs_sent": 3,
                           "msgs_recv": 3, "busy_ns": 2_000_000, "single_copy_sent": 0}
                          for p in range(d["nranks"]) if p != d["rank"]]
        (path / f"cadence-{d['comm_id']}-rank{d['rank']}.json").write_text(json.dumps(d))
    return str(path)


def doctor(args, capsys):
    rc = cli(["doctor", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def many_ranks(n=64, absent=37, late=12):
    """`n` ranks on n/8 hosts: 24 allreduces complete (rank `late` always
    enters 2 ms after the others), then rank `absent` never enters #25; the
    others wait on it around the ring and time out."""
    out = []
    for r in range(n):
        ops = []
        for i in range(1, 25):
            t = 0.01 * i + (0.002 if r == late else 0.0)
            ops.append(op(i, i, start=t, end=0.01 * i + 0.004))
        if r != absent:
            left = (r - 1) % n
            msgs = [msg((r + 1) % n, "send"),
                    msg(left, "recv", "pending" if left == absent else "done")]
            if left != absent:
                msgs.append(msg(left, "recv", "pending"))
            ops.append(op(25, 25, status=f"cadence comm c1 rank {r}, allreduce #25: timed out",
                          start=0.3, end=3.3 + 0.0001 * r, msgs=msgs))
        d = dump(r, n, ops, host="x", dumped=3.5)
        hosts = [f"node{q // 8}" for q in range(n)]
        d["host"] = hosts[r]
        d["hostname"] = hosts[r]
        d["peers"] = [{"rank": q, "host": hosts[q], "pid": 1000 + q} for q in range(n)]
        out.append(d)
    return out


# --- the trace ----------------------------------------------------------------


def _slices(tr):
    return [e for e in tr["traceEvents"] if e["ph"] == "X"]


def _thread_names(tr):
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in tr["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def _check_nesting(tr):
    """On every thread, two slices either do not overlap or one holds the
    other (what the trace-event format wants of complete events)."""
    by_thread = {}
    for e in _slices(tr):
        assert e["dur"] >= 0, e
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:], strict=False):
            assert b0 >= a1 - 1e-3 or b1 <= a1 + 1e-3, (a0, a1, b0, b1)


def test_trace_has_a_track_per_rank_and_corrected_times(tmp_path, capsys):
    """4 ranks on 4 hosts, link 1->2 down; rank 2's clock runs 5 s behind
    rank 0's and its dump says so: on the trace, rank 2 enters the stuck
    allreduce with the others."""
    d = write_dir(tmp_path / "d", _link_down_dumps(skew2=-5.0, offset2=-5.0, host_of=HOSTS4))
    out = tmp_path / "trace.json"
    rc, text, err = doctor([d, "--trace", str(out)], capsys)
    assert rc == 1 and err == "" and text.startswith("cadence doctor: comm_hang"), (text, err)
    tr = json.loads(out.read_text())
    assert tr["displayTimeUnit"] == "ms" and tr["otherData"]["verdict"]["class"] == "comm_hang"

    procs = {e["pid"]: e["args"]["name"] for e in tr["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(n.split(" ")[0] for n in procs.values()) == ["h0", "h1", "h2", "h3"]
    threads = _thread_names(tr)
    for r in range(4):
        [(pid, _)] = [k for k, n in threads.items() if n == f"rank {r} (h{r}, pid {1000 + r})"]
        assert procs[pid].startswith(f"h{r}")  # the rank's track is under its host
        assert any(n == f"rank {r} messages" and k[0] == pid for k, n in threads.items())

    xs = _slices(tr)
    ops = [e for e in xs if e["cat"] == "op"]
    msgs = [e for e in xs if e["cat"] == "message"]
    assert len(ops) == 4 * 3  # allreduce #1, #2 and the stuck #3 on every rank
    assert {e["name"] for e in ops} == {"allreduce #1", "allreduce #2", "allreduce #3 [failed]"}
    stuck = {threads[(e["pid"], e["tid"])].split(" (")[0]: e for e in ops
             if e["args"]["seq"] == 3}
    for e in stuck.values():
        assert set(e["args"]) >= {"seq", "sig", "bytes", "algo", "status"}
        assert e["args"]["sig"] == "00000000000000aa" and e["args"]["algo"] == "ring"
    # Corrected: every rank entered at 0.01 s on its own clock; rank 2's
    # clock is 5 s behind, its offset applied.
    assert min(e["ts"] for e in xs) == 0.0
    starts = {r: stuck[f"rank {r}"]["ts"] for r in range(4)}
    assert starts == {r: starts[0] for r in range(4)}, starts
    assert stuck["rank 0"]["dur"] == pytest.approx((3.75 - 0.01) * 1e6)

    # One slice per recorded message, on its rank's message track, inside
    # its operation's slice, named by direction and peer.
    recorded = sum(len(o["messages"] or []) for x in _link_down_dumps() for o in x["ops"])
    assert len(msgs) == recorded == 24
    op_by = {(e["pid"], e["args"]["id"]): e for e in ops}
    for m in msgs:
        o = op_by[(m["pid"], m["args"]["op_id"])]
        assert o["ts"] - 1e-3 <= m["ts"] and m["ts"] + m["dur"] <= o["ts"] + o["dur"] + 1e-3
        assert threads[(m["pid"], m["tid"])].endswith("messages")
        assert re.fullmatch(r"(send→|recv←)\d \d+ B( \[pending\])?", m["name"]), m["name"]
        assert set(m["args"]) >= {"state", "moved", "bytes", "peer", "op"}
    stalled = [m for m in msgs if m["pid"] == stuck["rank 2"]["pid"] and
               m["name"] == "recv←1 4096 B [pending]"]
    assert stalled and stalled[0]["args"]["moved"] == 1000 and "open" in stalled[0]["args"]
    _check_nesting(tr)
    # The verdict as a global instant, and each rank's dump on its track.
    assert any(e["ph"] == "i" and e["name"] == "verdict: comm_hang" for e in tr["traceEvents"])
    assert sum(e["ph"] == "i" and e["name"] == "dump" for e in tr["traceEvents"]) == 4

    # Without the offset in the dump, rank 2 would seem 5 s late: the trace
    # reads it.
    wrong = trace.build([parse(json.dumps(x), f"r{x['rank']}") for x in
                         _link_down_dumps(skew2=-5.0, offset2=0.0, host_of=HOSTS4)])
    th = _thread_names(wrong)
    st = {th[(e["pid"], e["tid"])].split(" (")[0]: e["ts"] for e in _slices(wrong)
          if e["cat"] == "op" and e["args"]["seq"] == 3}
    assert st["rank 0"] - st["rank 2"] == pytest.approx(5e6)


def test_trace_marks_what_was_still_running_at_the_dump():
    dumps = []
    for r in range(2):
        o = op(3, 3, "running", start=1.0, msgs=[msg(1 - r, "send"),
                                                 msg(1 - r, "recv", "pending", first=1.1,
                                                     moved=10)], state="live")
        dumps.append(parse(json.dumps(dump(r, 2, done_before(2) + [o], dumped=1.5)), f"r{r}"))
    tr = trace.build(dumps)
    running = [e for e in _slices(tr) if e["cat"] == "op" and e["args"]["seq"] == 3]
    assert len(running) == 2
    for e in running:
        assert e["name"] == "allreduce #3 [running]" and "open" in e["args"]
        assert e["dur"] == pytest.approx(0.5e6)  # from its start to the dump
        assert e["args"]["status"] == "running"
    pend = [e for e in _slices(tr) if e["cat"] == "message" and e["args"]["state"] == "pending"]
    assert len(pend) == 2
    for e in pend:
        # From its first progress to the dump, marked.
        o = next(x for x in running if x["pid"] == e["pid"])
        assert e["ts"] == pytest.approx(o["ts"] + 0.1e6)
        assert e["ts"] + e["dur"] == pytest.approx(o["ts"] + o["dur"])
        assert e["name"].endswith("[pending]") and "open" in e["args"]
    _check_nesting(tr)


def test_trace_puts_overlapping_messages_on_separate_tracks():
    # Two receives in flight at once on rank 0, and a sub-communicator.
    o = op(3, 3, start=0.0, end=1.0, msgs=[msg(1, "recv", first=0.1, last=0.6),
                                            msg(2, "recv", first=0.2, last=0.5),
                                            msg(1, "send", first=0.7, last=0.8)])
    dumps = [dump(0, 3, done_before(2) + [o])] + [dump(r, 3, done_before(3)) for r in (1, 2)]
    dumps += [dump(r, 2, done_before(1), comm="sub") for r in range(2)]
    tr = trace.build([parse(json.dumps(d), f"{d['comm_id']}{d['rank']}") for d in dumps])
    names = set(_thread_names(tr).values())
    assert {"rank 0 messages", "rank 0 messages 2"} <= names
    assert "comm sub rank 1 (hostA, pid 1001)" in names
    _check_nesting(tr)


# --- the exclusion list ------------------------------------------------------


def test_exclude_file_names_the_culprit_hosts(tmp_path, capsys):
    # A link down between h1 and h2: both ends.
    d = write_dir(tmp_path / "link", _link_down_dumps(host_of=HOSTS4))
    ex = tmp_path / "exclude"
    rc, _, err = doctor([d, "--exclude-file", str(ex)], capsys)
    assert rc == 1 and err == "" and ex.read_text() == "h1\nh2\n"
    # A rank that never entered: its host.
    dumps = [dump(r, 3, done_before(2) + [ring_fail(r)]) for r in (0, 1)]
    dumps.append(dump(2, 3, done_before(2)))
    for x in dumps:
        x["host"] = x["peers"][x["rank"]]["host"] = f"n{x['rank']}"
    d = write_dir(tmp_path / "never", dumps)
    rc, out, _ = doctor([d, "--exclude-file", str(ex), "--json"], capsys)
    assert rc == 1 and json.loads(out)["hosts"] == ["n2"] and ex.read_text() == "n2\n"
    # Healthy: an empty file.
    d = write_dir(tmp_path / "ok", [dump(r, 2, done_before(3)) for r in range(2)])
    rc, _, _ = doctor([d, "--exclude-file", str(ex)], capsys)
    assert rc == 0 and ex.read_text() == ""


def test_exclusion_uses_machine_names_and_skips_mismatches():
    """The default host identity is `<hostname>-<8 hex of the boot id>`,
    which no launcher knows: the host name is written instead. A mismatch is
    a program error: no host to exclude."""
    dumps = _frozen_dumps(with_victim=False)
    for x in dumps:
        for p in x["peers"]:
            p["host"] = f"gpu{p['rank']}-1a2b3c4d"
        x["host"] = x["peers"][x["rank"]]["host"]
        x["hostname"] = f"gpu{x['rank']}"
    parsed = [parse(json.dumps(x), f"r{x['rank']}") for x in dumps]
    v = diagnose(parsed)
    assert v.cls == "comm_hang" and v.hosts == ["gpu1-1a2b3c4d"], v.text()
    # Rank 1 left no dump: its name comes from the identity less the suffix.
    assert exclusion_hosts(v, parsed) == ["gpu1"]
    mism = [dump(r, 2, done_before(2) + [op(3, 3, "cadence: mismatch", 0.01, 0.02,
                                            sig=f"00000000000000a{r}")]) for r in range(2)]
    parsed = [parse(json.dumps(x), f"r{x['rank']}") for x in mism]
    v = diagnose(parsed)
    assert v.cls == "mismatch" and v.hosts and exclusion_hosts(v, parsed) == []


# --- outputs that cannot be written --------------------------------------------


def test_bad_output_paths_are_one_line_errors_before_any_work(tmp_path, capsys):
    d = write_dir(tmp_path / "d", _link_down_dumps())
    good = tmp_path / "report.html"
    for flag in ("--trace", "--html", "--exclude-file"):
        bad = str(tmp_path / "no" / "such" / "dir" / "out")
        rc, out, err = doctor([d, "--html", str(good), flag, bad], capsys)
        assert rc == 2 and out == "", (flag, out)
        assert err.startswith(f"cadence doctor: {flag} {bad}: no such directory"), err
        assert err.count("\n") == 1, err
        assert not good.exists()  # checked before anything was written
        rc, _, err = doctor([d, flag, str(tmp_path)], capsys)
        assert rc == 2 and "is a directory" in err and err.count("\n") == 1, err
    # The bad path is reported even when the input is bad too: the outputs
    # are checked first, and nothing is read.
    rc, _, err = doctor([str(tmp_path / "nope"), "--trace", str(tmp_path / "x" / "t")], capsys)
    assert rc == 2 and "--trace" in err and err.count("\n") == 1
    # They read dumps, not a running job's summaries.
    rc, _, err = doctor(["--store", "127.0.0.1:1", "--html", str(good)], capsys)
    assert rc == 2 and "--html reads a dump directory" in err and err.count("\n") == 1
    # As a user runs it: no traceback.
    p = subprocess.run([sys.executable, "-m", "cadence.cli.main", "doctor", d, "--html",
                        str(tmp_path / "missing" / "r.html")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1


# --- the HTML page --------------------------------------------------------------


def _html(tmp_path, capsys, dumps, name="report.html", rc_want=1):
    d = write_dir(tmp_path / name.replace(".html", ""), dumps)
    path = tmp_path / name
    rc, text, err = doctor([d, "--html", str(path)], capsys)
    assert rc == rc_want and err == "", (text, err)
    return path, path.read_text(), text.splitlines()[0].removeprefix("cadence doctor: ")


def _self_contained(page):
    # Nothing to fetch: no src/href attributes, no imports, no URLs but the
    # SVG namespace name (an identifier, never fetched).
    assert not re.search(r"\b(src|href)\s*=", page), "a reference to another resource"
    assert "@import" not in page and "url(http" not in page
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls


def test_html_report_of_a_stalled_link(tmp_path, capsys):
    dumps = _link_down_dumps(skew2=-5.0, offset2=-5.0, host_of=HOSTS4)
    path, page, headline = _html(tmp_path, capsys, dumps)
    _self_contained(page)
    assert page.startswith("<!DOCTYPE html>")
    assert f'id="headline">{html.escape(headline)}</p>' in page
    assert '<span class="badge">comm_hang</span>' in page
    # The link matrix: the stalled link outlined, with both sides in its tip;
    # link counters drawn beside it.
    cell = re.search(r'<rect class="cell"[^>]*stroke="#000"[^>]*><title>([^<]*)<', page)
    assert cell and html.unescape(cell[1]).startswith("link 1 → 2 (h1 → h2): stalled")
    assert "rank 2 received: 4.98 KiB of 8 KiB in 2 messages (done, pending)\n" \
           "  message 2: pending, 1000 B of 4 KiB" in html.unescape(cell[1]), cell[1]
    assert "cumulative bytes sent per link" in page
    # The timeline: 3 collectives, the stuck one highlighted; every rank
    # entered it at the same corrected time (0 µs after the first).
    assert "the last 3 collectives" in page
    tips = [html.unescape(t) for t in re.findall(r'class="bar"[^>]*><title>([^<]*)<', page)]
    stuck = [t for t in tips if "allreduce #3" in t]
    assert len(tips) == 12 and len(stuck) == 4
    assert all("entered 0 µs after the first rank" in t for t in stuck), stuck
    # The evidence, and the exclusion list with a launcher line.
    assert "link 1-&gt;2 (h1 -&gt; h2) stalled" in page
    assert "srun --exclude=h1,h2" in page


def test_html_report_scales_to_64_ranks(tmp_path, capsys):
    path, page, headline = _html(tmp_path, capsys, many_ranks(), name="big.html")
    assert headline.startswith("noncomm_hang in allreduce #25") and "rank 37" in headline
    _self_contained(page)
    assert len(page) < 3_000_000
    cells = re.findall(r'<rect class="cell" x="\S+" y="\S+" width="(\d+)"', page)
    assert len(cells) == 2 * 64 * 63 and {int(c) for c in cells} == {9}  # 576 px / 64
    assert "the last 20 collectives" in page
    tips = [html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", page)]
    assert "rank 37: never entered allreduce #25" in tips
    # The straggler is visible: it entered each earlier collective 2 ms late.
    late = [t for t in tips if t.startswith("rank 12 (node1) allreduce #20")]
    assert late and "entered 2.00 ms after the first rank" in late[0], late


def test_html_report_of_healthy_mismatched_and_running_jobs():
    def page(dumps, **kw):
        parsed = [parse(json.dumps(x), f"{x['comm_id']}{x['rank']}") for x in dumps]
        v = diagnose(parsed, **kw)
        text = report_html.render(parsed, v, counters={})
        _self_contained(text)
        return v, html.unescape(text)

    # A rank that never entered, with its Python stack in its dump (as the
    # live diagnosis's summaries carry it): the page shows it.
    never = [dump(r, 3, done_before(2) + [ring_fail(r)]) for r in (0, 1)]
    never.append({**dump(2, 3, done_before(2)),
                  "stack": 'Thread 0x1 (most recent call first):\n  File "train.py", line 12 '
                           "in load_batch\n"})
    v, text = page(never)
    assert v.cls == "noncomm_hang" and v.ranks == [2]
    assert "Python stacks of the named ranks" in text and 'line 12 in load_batch' in text

    # Healthy, two communicators: the largest is drawn, its last collective.
    v, text = page([dump(r, 3, done_before(4)) for r in range(3)] +
                   [dump(r, 2, done_before(2), comm="sub") for r in range(2)])
    assert v.cls == "healthy" and '<span class="badge">healthy</span>' in text
    assert "allreduce #4 (the last collective every dumped rank recorded)" in text
    assert "exclude on restart" not in text and "other communicators" in text
    # A mismatch: the ranks named, no exclusion list.
    mism = [dump(r, 3, done_before(2) + [op(3, 3, "cadence: mismatch", 0.01, 0.02,
                                           sig="00000000000000bb" if r == 1 else
                                           "00000000000000aa",
                                           coll="allgather" if r == 1 else "allreduce")])
            for r in range(3)]
    v, text = page(mism)
    assert v.cls == "mismatch" and "rank 1 (hostA, pid 1001)" in text
    assert "exclude on restart" not in text
    # Dumped on demand while the operation still ran: its bars are marked,
    # and the dumps have no link counters then.
    dumps = [dump(r, 2, done_before(2) + [op(3, 3, "running", start=1.0, state="live",
                                             msgs=[msg(1 - r, "recv", "pending")])],
                  dumped=1.5) for r in range(2)]
    v, text = page(dumps, hang_after=0.2)
    assert v.cls == "comm_hang"
    assert "still running at its dump" in text and "no link counters in these dumps" in text


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium; "
                "`make build` installs it as root)")


def render(page: str, tmp_path, size=(1280, 1600)):
    """Loads a page in headless Chromium twice: the DOM after its scripts
    ran, with the console on stderr; then a screenshot. Returns (dom,
    console lines, png path)."""
    exe = _chromium()
    url = "file://" + os.path.abspath(page)
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-extensions", f"--user-data-dir={tmp_path / 'chromium-profile'}",
            f"--window-size={size[0]},{size[1]}"]
    env = {**os.environ, "HOME": str(tmp_path)}
    p = subprocess.run(base + ["--enable-logging=stderr", "--v=0", "--dump-dom", url],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    console = [x for x in p.stderr.splitlines() if ":CONSOLE" in x or "Uncaught" in x]
    png = tmp_path / (os.path.basename(page) + ".png")
    q = subprocess.run(base + [f"--screenshot={png}", url], capture_output=True, text=True,
                       timeout=120, env=env)
    assert q.returncode == 0 and png.exists(), q.stderr[-2000:]
    return p.stdout, console, png


def _errors(dom):
    """What the page's error handler recorded on <html>, or None."""
    tag = re.search(r"<html[^>]*>", dom)[0]
    m = re.search(r'data-errors="([^"]*)"', tag)
    return None if m is None else html.unescape(m[1])


def _check_png(png, size):
    """A PNG of the window's size with more than a blank page in it;
    returns its top quarter as pixels when Pillow is there, else None."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    assert (w, h) == size, (w, h)
    assert len(data) > 20_000, len(data)  # a blank page is a few KB
    try:
        from PIL import Image
    except ImportError:
        return
    px = np.asarray(Image.open(png).convert("RGB"))
    assert len(np.unique(px.reshape(-1, 3), axis=0)) > 50
    return px[: h // 4]


def test_headless_chromium_sees_script_errors(tmp_path):
    """The checks below are not vacuous: a page with a script error fails them."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><head><script>" + report_html.JS_ERRORS +
                    "</script></head><body><p>x</p><script>noSuchFunction();</script>"
                    "</body></html>")
    dom, console, _ = render(str(page), tmp_path, size=(400, 300))
    assert "noSuchFunction" in _errors(dom)
    assert any("Uncaught" in x for x in console), console


@pytest.mark.parametrize("which", ["2 ranks", "64 ranks"])
def test_html_report_in_headless_chromium(which, tmp_path, capsys):
    if which == "2 ranks":
        dumps = [dump(r, 2, done_before(2) + [op(3, 3, "cadence: timed out", 0.01, 3.7, msgs=[
            msg(1 - r, "send"), msg(1 - r, "recv", "pending")])]) for r in range(2)]
        dumps[1]["ops"][-1]["messages"] = [msg(0, "send", "pending"),
                                           msg(0, "recv", "pending")]
        size = (1280, 1400)
    else:
        dumps = many_ranks()
        size = (1280, 3000)
    path, page, headline = _html(tmp_path, capsys, dumps, name="r.html")
    dom, console, png = render(str(path), tmp_path, size)
    assert not console, console  # the page logs nothing: any line is an error
    assert _errors(dom) is None, _errors(dom)
    assert 'data-ready="1"' in dom  # its script ran to the end
    assert html.escape(headline, quote=False) in dom
    top = _check_png(png, size)
    if top is not None:
        # The verdict's banner is drawn at the top, in its class's color.
        cls = headline.split(" ")[0]
        want = np.array([int(report_html.CLASS_COLORS[cls][i:i + 2], 16) for i in (1, 3, 5)])
        near = np.abs(top.astype(int) - want).max(axis=-1) <= 12
        assert near.sum() > 2000, (cls, near.sum())


# --- a real job ------------------------------------------------------------------


def _never_enters(comm, dump_dir, absent):
    import cadence

    x = np.ones(1 << 15, dtype=np.float32)
    for _ in range(5):
        comm.allreduce(x)
    comm.barrier()
    if comm.rank == absent:
        comm.dump(dump_dir)  # what it did so far; then it is gone elsewhere
        time.sleep(4.5)
        return "slept"
    try:
        comm.allreduce(x)
    except cadence.CommError as e:
        return str(e)
    return "no error"


def test_reports_of_a_real_job(tmp_path, capsys):
    """2 hosts x 2 ranks (TCP between hosts, one machine's clock); rank 3
    dumps, then never enters an allreduce; the others time out and dump."""
    dumps_dir = tmp_path / "dumps"
    res = run_ranks(_never_enters, 4, transport="mixed", args=(str(dumps_dir), 3),
                    env={"CADENCE_DUMP_DIR": str(dumps_dir)}, op_timeout=3.0, timeout=90)
    assert all(res[r][0] == "ok" for r in range(4)), res
    tr_path, html_path, ex = tmp_path / "t.json", tmp_path / "r.html", tmp_path / "exclude"
    rc, text, err = doctor([str(dumps_dir), "--trace", str(tr_path), "--html", str(html_path),
                            "--exclude-file", str(ex)], capsys)
    assert rc == 1 and err == "", (text, err)
    dumps, _ = load_dir(str(dumps_dir))
    v = diagnose(dumps)
    seq = v.op.seq  # start-up's own collectives come first
    assert text.startswith(f"cadence doctor: noncomm_hang in allreduce #{seq} "), text
    assert v.ranks == [3] and ex.read_text() == "host1\n"

    tr = json.loads(tr_path.read_text())
    procs = {e["pid"]: e["args"]["name"] for e in tr["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(n.split(" ")[0] for n in procs.values()) == ["host0", "host1"]
    threads = _thread_names(tr)
    for d in dumps:
        assert f"rank {d.rank} ({d.host}, pid {d.pid})" in threads.values()
    ops = [e for e in _slices(tr) if e["cat"] == "op"]
    assert len(ops) == sum(len(d.ops) for d in dumps)
    stuck = [e for e in ops if e["name"] == f"allreduce #{seq} [failed]"]
    assert len(stuck) == 3
    # On rank 0's clock the three entered within a few ms of each other.
    assert max(e["ts"] for e in stuck) - min(e["ts"] for e in stuck) < 100e3
    # Messages of the stuck operation are recorded, inside their slices.
    msgs = [e for e in _slices(tr) if e["cat"] == "message" and e["args"]["op"] ==
            f"allreduce #{seq}"]
    assert any(m["args"]["state"] == "pending" and m["args"]["peer"] == 3 for m in msgs), msgs
    _check_nesting(tr)

    page = html_path.read_text()
    _self_contained(page)
    headline = text.splitlines()[0].removeprefix("cadence doctor: ")
    assert html.escape(headline) in page
    assert f"rank 3: never entered allreduce #{seq}" in html.unescape(page)
    if shutil.which("chromium"):
        dom, console, png = render(str(html_path), tmp_path)
        assert not console and _errors(dom) is None and 'data-ready="1"' in dom
        assert html.escape(headline, quote=False) in dom
        _check_png(png, (1280, 1600))
