#!/bin/bash
# check-libvirt.sh: vrdma-guest.xml is a valid libvirt domain (libvirt's RelaxNG schema through
# virt-xml-validate) and still has what a vrdma guest needs: shared memfd memory and the
# vhost-user chardev + device passed to QEMU.
set -euo pipefail

xml=$(cd "$(dirname "$0")" && pwd)/libvirt/vrdma-guest.xml
virt-xml-validate "$xml" domain

expect() { # XPATH WHAT
	local n
	n=$(xmllint --xpath "count($1)" "$xml")
	[ "$n" -ge 1 ] || { echo "$xml: no $2 ($1)" >&2; exit 1; }
}
expect "/domain/memoryBacking/source[@type='memfd']" "memfd memory backing"
expect "/domain/memoryBacking/access[@mode='shared']" "shared memory access"
# The device in QEMU's JSON form (see the comment in the XML: a key=value -device clashes with
# libvirt's PCI addresses).
arg="//*[local-name()='commandline']/*[local-name()='arg']"
for a in '-chardev' 'socket,id=vrdma0,path=/run/vrdma/vrdma0/vrdma0.sock' \
	'-device' '{"driver":"vhost-user-rdma-pci","chardev":"vrdma0"}'; do
	expect "${arg}[@value='$a']" "qemu:commandline argument $a"
done
echo "libvirt domain: ok"
