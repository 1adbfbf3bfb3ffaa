"""The main report from the command line: its headline names the fastest schedule that fits,
and its metrics table agrees with the command's own records."""

from __future__ import annotations

import json
import re
from html import unescape

from pipesched.bubbles import BUBBLE_PARTS


def test_compare_html_headline_and_bubble_breakdown(cli, tmp_path) -> None:
    html = tmp_path / "report.html"
    result = cli("compare", "--schedules", "1f1b,zb-h1,zb-v,gpipe", "-p", "8", "-m", "16", "--levels", "sim",
                 "--json", "--html", str(html))
    assert result.code == 0, result
    records = json.loads(result.out)["records"]
    fitting = [r for r in records if not r["any_out_of_memory"]]
    best = min(fitting, key=lambda r: r["iteration_time_s"])
    baseline = next(r for r in records if r["schedule"] == "1f1b")
    faster = 1 - best["iteration_time_s"] / baseline["iteration_time_s"]
    text = html.read_text()
    headline = unescape(re.search(r'id="report-headline">([^<]*)<', text).group(1))
    assert headline == (f"fastest that fits: {best['schedule']} {best['iteration_time_s']:.4g} s, {faster:.1%} faster "
                        f"than 1f1b; {len(records) - len(fitting)} of {len(records)} out of memory")
    # the metrics and comparison rows link to their panels, one per schedule each
    assert text.count('<tr data-link="timeline-') == 2 * len(records)
    assert any(part in text for part in BUBBLE_PARTS)
    assert 'id="op-search"' in text and 'id="show-critical"' in text and 'id="share-axis"' in text


def test_show_html_is_the_same_report(cli, tmp_path) -> None:
    html = tmp_path / "show.html"
    result = cli("show", "dualpipev", "-p", "4", "-m", "8", "--html", str(html))
    assert result.code == 0, result
    text = html.read_text()
    assert 'data-kind="overlapped forward + backward"' in text  # the fused pairs in the legend
    # one schedule: its own figures (the slot table's 54 slots of the grid's formula line)
    headline = unescape(re.search(r'id="report-headline">([^<]*)<', text).group(1))
    makespan = re.search(r"makespan (\d+)", result.out).group(1)
    assert headline.startswith(f"dualpipev: iteration {makespan} slots · bubble ")


def test_simulate_html_has_the_rates_the_terminal_prints(cli, tmp_path) -> None:
    html = tmp_path / "sim.html"
    result = cli("simulate", "1f1b", "-p", "8", "-m", "16", "--html", str(html), "--json")
    assert result.code == 0, result
    data = json.loads(result.out)
    text = html.read_text()
    section = text[text.index('<section id="comparison">'):text.index("</section>", text.index('id="comparison"'))]
    cells = [unescape(c) for c in re.findall(r"<td[^>]*>([^<]*)</td>", section)]
    assert cells == ["1f1b", f"{data['throughput_samples_per_s']:.4g}", f"{round(data['throughput_tokens_per_s']):,}",
                     f"{100 * data['mfu']:.1f}%", f"{100 * data['hfu']:.1f}%"]
    # and the critical path and the exposed and hidden communication in the metrics
    assert "critical path: compute + comm" in text and "comm exposed / hidden" in text
