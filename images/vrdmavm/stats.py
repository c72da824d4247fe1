"""The backends' stats sockets, read with `vrdma-backend stats --socket PATH`.

Two sockets are read: a device's own (`vu-<i>.sock`: that device's `vrdma_port_*` counters,
spec §16.5) and the shared daemon's operator socket (`Cluster.fabric_stats`: the
fabric-wide `vrdma_fabric_*` counters of every port). The text is Prometheus' exposition
format; a Stats holds one reading, the functions below name what the scenarios ask of it.
"""

import re
import subprocess

# One sample line: name, optional {labels}, value.
SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})? (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


class Sample:
    """One counter sample: its name, labels (in order) and integer value; `series` is the
    name with its labels as printed (`vrdma_port_x{device="vm0"}`)."""

    def __init__(self, name, labels, value, series):
        self.name, self.labels, self.value, self.series = name, labels, value, series


def scrape(backend, socket_path):
    """`vrdma-backend stats --socket socket_path` as a CompletedProcess (text)."""
    return subprocess.run([backend, "stats", "--socket", socket_path],
                          capture_output=True, text=True, timeout=30)


def parse(text):
    """The integer samples of an exposition text (comments and other values skipped)."""
    samples = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or not m.group(3).isdigit():
            continue
        labels = dict(LABEL.findall(m.group(2) or ""))
        samples.append(Sample(m.group(1), labels, int(m.group(3)),
                              m.group(1) + (m.group(2) or "")))
    return samples


class Stats:
    """One reading of a stats socket."""

    def __init__(self, text):
        self.text = text
        self.samples = parse(text)

    def port_counters(self):
        """The `vrdma_port_*` counters that have one sample per device (no other labels):
        name -> value."""
        return {s.name: s.value for s in self.samples
                if s.name.startswith("vrdma_port_") and list(s.labels) == ["device"]}

    def port_drops(self):
        """The device's intake drops (`vrdma_port_drops_total`) as "drops_<reason>" -> n."""
        return {"drops_" + s.labels["reason"]: s.value for s in self.samples
                if s.name == "vrdma_port_drops_total" and list(s.labels) == ["device", "reason"]}

    def fabric_drops(self):
        """The fabric's drops (`vrdma_fabric_drops_total`) by (port, reason)."""
        return {(s.labels["port"], s.labels["reason"]): s.value for s in self.samples
                if s.name == "vrdma_fabric_drops_total"
                and list(s.labels) == ["port", "kind", "reason"]}

    def fabric_drops_total(self):
        """Every frame the fabric dropped, any port and reason."""
        return sum(s.value for s in self.samples
                   if s.name == "vrdma_fabric_drops_total" and s.labels)

    def frame_counters(self):
        """Where frames went: every labelled `vrdma_port_*` and `vrdma_fabric_*` sample but
        the drops, by series (name and labels)."""
        return {s.series: s.value for s in self.samples if s.labels and re.match(
            r"vrdma_(?:port|fabric)_(?!drops)", s.name)}


def device_stats(vm):
    """A reading of vm's device's own stats socket (its vhost-user socket)."""
    return Stats(scrape(vm.cluster.backend, vm.vu_sock).stdout)


def fabric_stats(cluster):
    """A reading of the shared daemon's operator socket (every port of the fabric)."""
    return Stats(scrape(cluster.backend, cluster.fabric_stats).stdout)


def port_counters(vm):
    """vm's device's single-sample `vrdma_port_*` counters: name -> value."""
    return device_stats(vm).port_counters()


def port_drops(vm):
    """vm's device's intake drops as "drops_<reason>" -> n."""
    return device_stats(vm).port_drops()
