#!/usr/bin/env python3
"""Boot one vrdma guest through libvirt, from packaging/libvirt/vrdma-guest.xml.

A private libvirtd in session mode (qemu:///session) runs with its own config, run and cache
directories under a scratch directory, so the host's libvirt (if any) is neither used nor
touched. Session mode is what makes that possible: a privileged libvirtd always uses
/etc/libvirt, /run/libvirt and /var/lib/libvirt. Since a libvirtd run by root is always the
privileged one, as root everything (libvirtd, its QEMU, virsh and vrdma-backend) runs as
`nobody` instead; QEMU then connects to a backend socket of its own user.

The packaging XML is adapted to this machine, not rewritten: TCG (type='qemu', -cpu max),
direct kernel boot of the images/ kernel and initrd, no disk or NIC (the initrd is the root file
system), the serial console to a file, the agent's virtio-serial channel, and the socket path
and firmware directories (-L) in <qemu:commandline>. The memory backing (memfd, shared) and the
vhost-user-rdma-pci arguments stay as shipped, which is what this test is about.

It passes when the guest console prints "vrdma-init: ready" and shows the vrdma driver bound to
the device, the backend logged the acked virtio features and the guest memory table, and QEMU
got memfd memory with share=on from libvirt. Then the domain is destroyed and everything
stopped. Logs go to --results (default results/libvirt-boot/).

Usage: tests/libvirt/boot_guest.py [--timeout S] [--keep] [--results DIR]
Paths: VRDMA_QEMU, VRDMA_KERNEL, VRDMA_INITRD, VRDMA_BACKEND as for the images/vrdmavm launcher.
"""

import argparse
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "images"))
import vrdmavm  # noqa: E402  (default image paths, shared with the VM tests)

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
NAME = "vrdma-guest"
MAC = "52:54:00:76:72:01"
AGENT_PORT = "org.vrdma.agent"
# Debian packages: the monolithic daemon (it depends on its QEMU driver) and virsh.
PACKAGES = {"libvirtd": "libvirt-daemon", "virsh": "libvirt-clients"}


class BootError(Exception):
    pass


def log(msg):
    print("libvirt-boot: " + msg, flush=True)


def install_deps():
    """apt-get what is missing, nothing when every command is there."""
    need = [pkg for cmd, pkg in PACKAGES.items() if not shutil.which(cmd, path=os.environ.get(
        "PATH", "") + ":/usr/sbin:/sbin")]
    if not need:
        return
    if os.geteuid() != 0:
        raise BootError("missing %s and not root: apt-get install them" % " ".join(need))
    log("installing " + " ".join(need))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends"] + need
    if subprocess.call(cmd, env=env) != 0:
        subprocess.check_call(["apt-get", "update"], env=env)
        subprocess.check_call(cmd, env=env)


def free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """The scratch directory, the user everything runs as, and the processes started."""

    def __init__(self, work):
        self.work = work
        if os.geteuid() == 0:
            pw = pwd.getpwnam("nobody")
            self.uid, self.gid = pw.pw_uid, pw.pw_gid
        else:
            self.uid, self.gid = os.geteuid(), os.getegid()
        d = lambda *p: os.path.join(work, *p)  # noqa: E731
        self.home, self.config, self.cache, self.run = d("home"), d("config"), d("cache"), d("run")
        self.console = d("console.log")
        self.backend_log = d("backend.log")
        self.libvirtd_log = d("libvirtd.log")  # written by libvirtd itself (log_outputs)
        self.libvirtd_out = d("libvirtd.out")  # its stdout and stderr
        self.vu_sock = d("vu.sock")
        self.agent_sock = d("agent.sock")
        self.libvirt_sock = os.path.join(self.run, "libvirt", "libvirt-sock")
        self.uri = "qemu+unix:///session?socket=" + self.libvirt_sock
        self.env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": self.home, "XDG_CONFIG_HOME": self.config, "XDG_CACHE_HOME": self.cache,
            "XDG_RUNTIME_DIR": self.run, "LANG": "C", "RUST_LOG": "info",
        }
        self.libvirtd = self.backend = None

    def setup(self):
        for p in (self.home, os.path.join(self.config, "libvirt"), self.cache, self.run):
            os.makedirs(p, mode=0o700, exist_ok=True)
        # QEMU's stdout/stderr to a file instead of through virtlogd: one daemon less.
        with open(os.path.join(self.config, "libvirt", "qemu.conf"), "w") as f:
            f.write('stdio_handler = "file"\n')
        with open(os.path.join(self.config, "libvirt", "libvirtd.conf"), "w") as f:
            f.write('log_outputs = "3:file:%s"\n' % self.libvirtd_log)
        for root, dirs, files in os.walk(self.work):
            for n in [root] + [os.path.join(root, x) for x in dirs + files]:
                os.chown(n, self.uid, self.gid)

    def _drop(self):
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(self.gid)
            os.setuid(self.uid)
        os.setsid()

    def popen(self, cmd, logfile):
        with open(logfile, "ab") as out:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=self.env,
                                    preexec_fn=self._drop)

    def virsh(self, *args, check=True):
        r = subprocess.run(["virsh", "-q", "-c", self.uri] + list(args), env=self.env,
                           preexec_fn=self._drop, capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise BootError("virsh %s: %s%s" % (" ".join(args), r.stdout, r.stderr))
        return r.stdout

    def start_libvirtd(self):
        # Foreground, so this script owns its pid; --timeout is not used so it never exits early.
        self.libvirtd = self.popen(["libvirtd"], self.libvirtd_out)
        wait_for(lambda: os.path.exists(self.libvirt_sock), 30, "libvirtd socket",
                 self.libvirtd, self.libvirtd_out)

    def start_backend(self, binary):
        port_a, port_b = free_udp_port(), free_udp_port()
        self.backend = self.popen(
            [binary, "--socket-path", self.vu_sock, "--mac", MAC, "--uplink",
             "udp:local=127.0.0.1:%d,remote=127.0.0.1:%d" % (port_a, port_b)],
            self.backend_log)
        wait_for(lambda: os.path.exists(self.vu_sock), 20, "backend socket",
                 self.backend, self.backend_log)

    def qemu_pid(self):
        try:
            with open(os.path.join(self.run, "libvirt", "qemu", "run", NAME + ".pid")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def qemu_log(self):
        return os.path.join(self.cache, "libvirt", "qemu", "log", NAME + ".log")

    def stop(self):
        if self.libvirtd is not None and self.libvirtd.poll() is None:
            self.virsh("destroy", NAME, check=False)
            self.virsh("undefine", NAME, check=False)
        pid = self.qemu_pid()  # a QEMU left behind by a libvirtd that died
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in (self.libvirtd, self.backend):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no %s)" % path


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def wait_for(cond, timeout, what, proc=None, logfile=None, interval=0.2):
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise BootError("%s: process exited with %s:\n%s" % (what, proc.returncode,
                                                                 tail(logfile)))
        if time.monotonic() > deadline:
            raise BootError("%s: not there after %ds" % (what, timeout))
        time.sleep(interval)


def domain_xml(src, run, paths):
    """The packaging domain with this machine's paths (see the module docstring)."""
    ET.register_namespace("qemu", QEMU_NS)
    tree = ET.parse(src)
    dom = tree.getroot()
    dom.set("type", "qemu")
    dom.find("name").text = NAME
    for tag in ("memory", "currentMemory"):
        e = dom.find(tag)
        e.set("unit", "MiB")
        e.text = "1024"
    dom.find("vcpu").text = "1"
    os_el = dom.find("os")
    for e in os_el.findall("boot"):
        os_el.remove(e)
    cmdline = ("console=ttyS0 panic=-1 mitigations=off 8250.nr_uarts=1 no_timer_check "
               "vrdmavm.role=vrdma vrdmavm.hostname=%s vrdmavm.ip=10.0.0.1/24" % NAME)
    for tag, text in (("kernel", paths["kernel"]), ("initrd", paths["initrd"]),
                      ("cmdline", cmdline)):
        ET.SubElement(os_el, tag).text = text
    cpu = dom.find("cpu")
    cpu.attrib.clear()
    cpu.set("mode", "maximum")  # -cpu max: TCG has no host CPU to pass through
    # A guest panic reboots (panic=-1); end the domain then instead of booting again.
    dom.find("on_reboot").text = "destroy"
    devs = dom.find("devices")
    devs.find("emulator").text = paths["qemu"]
    for tag in ("disk", "interface", "serial", "console"):
        for e in devs.findall(tag):
            devs.remove(e)
    serial = ET.SubElement(devs, "serial", type="file")
    ET.SubElement(serial, "source", path=run.console)
    ET.SubElement(serial, "target", port="0")
    chan = ET.SubElement(devs, "channel", type="unix")
    ET.SubElement(chan, "source", mode="bind", path=run.agent_sock)
    ET.SubElement(chan, "target", type="virtio", name=AGENT_PORT)
    ET.SubElement(devs, "memballoon", model="none")
    qcmd = dom.find("{%s}commandline" % QEMU_NS)
    n_sock = 0
    for arg in qcmd.findall("{%s}arg" % QEMU_NS):
        v = arg.get("value")
        if v.startswith("socket,") and "path=" in v:
            arg.set("value", re.sub(r"path=[^,]*", "path=" + run.vu_sock, v))
            n_sock += 1
    if n_sock != 1:
        raise BootError("%s: expected one vhost-user chardev in <qemu:commandline>" % src)
    # This QEMU build finds its firmware (SeaBIOS, linuxboot_dma.bin) in Debian's directories.
    for d in ("/usr/share/seabios", "/usr/share/qemu"):
        ET.SubElement(qcmd, "{%s}arg" % QEMU_NS, value="-L")
        ET.SubElement(qcmd, "{%s}arg" % QEMU_NS, value=d)
    return ET.tostring(dom, encoding="unicode")


def check(run):
    """What proves the guest bound the device; returns the lines that show it."""
    console, backend = read(run.console), read(run.backend_log)
    qemu = read(run.qemu_log())
    found = []
    m = re.search(r"virtio features: offered (0x[0-9a-f]+), acked (0x[0-9a-f]+)", backend)
    if not m or int(m.group(2), 16) == 0:
        raise BootError("backend log has no non-zero acked virtio features:\n" +
                        tail(run.backend_log))
    found.append(m.group(0))
    m = re.search(r"guest memory table: (\d+) region\(s\)", backend)
    if not m or int(m.group(1)) == 0:
        raise BootError("backend log has no guest memory table:\n" + tail(run.backend_log))
    found.append(m.group(0))
    # vrdma_main.c's probe message: "<ibdev> on <netdev>, mac ..., port ..."
    m = re.search(r"vrdma\d+ on \S+, mac [0-9a-f:]+ .*", console)
    if not m:
        raise BootError("console shows no vrdma device registered:\n" + tail(run.console))
    found.append(m.group(0).strip())
    if MAC not in m.group(0):
        raise BootError("guest device has not the backend's MAC %s: %s" % (MAC, m.group(0)))
    if not re.search(r"memory-backend-memfd.*share.{0,3}(true|on)", qemu):
        raise BootError("libvirt did not give QEMU shared memfd memory:\n" + tail(run.qemu_log()))
    found.append("QEMU: memory-backend-memfd with share")
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--xml", default=os.path.join(REPO, "packaging", "libvirt",
                                                  "vrdma-guest.xml"))
    ap.add_argument("--timeout", type=int, default=150, help="seconds for the guest to be ready")
    ap.add_argument("--results", default=os.path.join(REPO, "results", "libvirt-boot"))
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    a = ap.parse_args()

    install_deps()
    paths = vrdmavm.default_paths()
    for k in ("qemu", "kernel", "initrd", "backend"):
        if not os.path.exists(paths[k]):
            raise BootError("%s %s missing (make images / cargo build --release)" % (k, paths[k]))
    # The scratch directory must be reachable by `nobody`; the sockets need a short path.
    work = tempfile.mkdtemp(prefix="vrdma-lv-")
    os.chmod(work, 0o755)
    run = Run(work)
    # QEMU runs as run.uid: give it the images it reads through paths it can open.
    for k in ("kernel", "initrd", "qemu"):
        paths[k] = os.path.realpath(paths[k])
    backend = os.path.join(work, "vrdma-backend")
    shutil.copy2(paths["backend"], backend)
    ok = False
    t0 = time.monotonic()
    try:
        run.setup()
        xml_path = os.path.join(work, "domain.xml")
        with open(xml_path, "w") as f:
            f.write(domain_xml(a.xml, run, paths))
        os.chown(xml_path, run.uid, run.gid)
        run.start_libvirtd()
        log("libvirtd (session, uid %d) on %s" % (run.uid, run.libvirt_sock))
        run.start_backend(backend)
        run.virsh("define", xml_path)
        run.virsh("start", NAME)
        log("domain started, qemu pid %s; waiting for the guest" % run.qemu_pid())
        wait_for(lambda: "vrdma-init: ready" in read(run.console) or
                 run.virsh("domstate", NAME, check=False).strip() != "running",
                 a.timeout, "guest console 'vrdma-init: ready'", run.backend, run.backend_log,
                 interval=1)
        if "vrdma-init: ready" not in read(run.console):
            raise BootError("domain stopped before the guest was ready:\n%s\nQEMU log:\n%s" % (
                tail(run.console), tail(run.qemu_log())))
        log("guest ready after %.0fs" % (time.monotonic() - t0))
        for line in check(run):
            log("  " + line)
        ok = True
    finally:
        run.stop()
        os.makedirs(a.results, exist_ok=True)
        for src, dst in ((run.console, "console.log"), (run.backend_log, "backend.log"),
                         (run.libvirtd_log, "libvirtd.log"), (run.libvirtd_out, "libvirtd.out"),
                         (run.qemu_log(), "qemu.log"),
                         (os.path.join(work, "domain.xml"), "domain.xml")):
            if os.path.exists(src):
                shutil.copy(src, os.path.join(a.results, dst))
        if ok and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log("scratch directory kept: " + work)
    log("PASS in %.0fs (logs in %s)" % (time.monotonic() - t0, a.results))


if __name__ == "__main__":
    try:
        main()
    except (BootError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print("libvirt-boot: FAIL: %s" % e, file=sys.stderr)
        sys.exit(1)
