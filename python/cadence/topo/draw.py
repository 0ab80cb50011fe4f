"""`cadence topo show --png`: the alone-rate matrix with hosts grouped as
inferred (a box per group), and the widest ring over the hosts."""

from __future__ import annotations

import math

#: Hosts up to which the drawing names every host.
LABELS_MAX_HOSTS = 24


def draw(doc: dict, ring: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    hosts, rates, groups = doc["hosts"], doc["rates"], doc["groups"]
    by_group = [h for g in groups for h in g]
    n = len(hosts)
    mbit = [[rates[a][b] * 8 / 1e6 if a != b else float("nan") for b in by_group]
            for a in by_group]  # fmt: skip
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.5))
    im = left.imshow(mbit, cmap="viridis")
    fig.colorbar(im, ax=left, label="Mbit/s, one flow alone")
    many = n > LABELS_MAX_HOSTS
    if many:
        # Too many hosts to name: a tick at each group's first host.
        starts = [sum(len(g) for g in groups[:k]) for k in range(len(groups))]
        left.set_xticks(starts, [f"g{k}" for k in range(len(groups))], fontsize=7)
        left.set_yticks(starts, [f"g{k}" for k in range(len(groups))], fontsize=7)
    else:
        names = [hosts[h] for h in by_group]
        left.set_xticks(range(n), names, rotation=60, ha="right")
        left.set_yticks(range(n), names)
    left.set_xlabel("to")
    left.set_ylabel("from")
    at = 0
    colors = plt.get_cmap("tab10")
    for g, members in enumerate(groups):
        k = len(members)
        left.add_patch(Rectangle((at - 0.5, at - 0.5), k, k, fill=False, lw=2.5,
                                 edgecolor=colors(g % 10)))  # fmt: skip
        at += k
    left.set_title("alone rates, hosts by inferred group")

    # Hosts around a circle in ring order: the ring is the circle, and its
    # red arcs are where it crosses between groups.
    pos = {h: (math.sin(2 * math.pi * i / n), math.cos(2 * math.pi * i / n))
           for i, h in enumerate(ring)}  # fmt: skip
    group_of = {h: g for g, members in enumerate(groups) for h in members}
    for i in range(len(ring)):
        a, b = ring[i], ring[(i + 1) % len(ring)]
        (x0, y0), (x1, y1) = pos[a], pos[b]
        across = group_of[a] != group_of[b]
        if many:
            # Lines, not arrows: hundreds of arrow patches draw for minutes.
            right.plot([x0, x1], [y0, y1], lw=2.0 if across else 0.6,
                       color="tab:red" if across else "gray")  # fmt: skip
            continue
        right.annotate("", xy=(x1, y1), xytext=(x0, y0),
                       arrowprops={"arrowstyle": "-|>", "lw": 2.5 if across else 1.2,
                                   "color": "tab:red" if across else "gray",
                                   "shrinkA": 14, "shrinkB": 14})  # fmt: skip
    for h, (x, y) in pos.items():
        right.scatter([x], [y], s=12 if many else 300, color=colors(group_of[h] % 10), zorder=3)
        if not many:
            right.annotate(f"{hosts[h]} (group {group_of[h]})", (x * 1.18, y * 1.18),
                           ha="center", va="center", fontsize=9)  # fmt: skip
    right.set_xlim(-1.4, 1.4)
    right.set_ylim(-1.4, 1.4)
    right.set_aspect("equal")
    right.axis("off")
    right.set_title("widest ring (red: crosses between groups)")
    fig.suptitle(doc.get("note", ""))
    fig.tight_layout()
    fig.subplots_adjust(bottom=0.2)
    fig.savefig(path, dpi=110)
    plt.close(fig)
