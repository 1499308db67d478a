package qemu

import (
	"encoding/binary"
	"fmt"
	"os"
	"syscall"
)

// The empty qcow2 layer Create writes, as qemu-img create -u -f qcow2 -o
// backing_file=…,backing_fmt=…,lazy_refcounts=on makes one (QEMU's
// docs/interop/qcow2.txt): version 3, 64 KiB clusters, 16-bit refcounts.
// Cluster 0 holds the header, the backing format extension and the
// backing file's name; cluster 1 the refcount table; cluster 2 its one
// refcount block; the L1 table, all zeros, starts at cluster 3 and ends
// the file. Nothing is allocated for guest data: every read goes to the
// backing file until the guest writes.
const (
	qcow2ClusterBits   = 16
	qcow2Cluster       = 1 << qcow2ClusterBits
	qcow2HeaderLen     = 112 // version 3's fields with the compression type, padded
	qcow2CompatLazyRef = 1 << 0
	qcow2RefOrder      = 4 // 16-bit refcounts
	// maxLayerSize bounds a layer's virtual size: QEMU's own limit on the
	// L1 table (32 MiB) is 2 PiB; kosa8's disks are far below 64 TiB.
	maxLayerSize = 64 << 40
)

// qcow2Overlay returns the pieces of an empty qcow2 layer of size bytes
// over backing (in backingFormat), by offset, and the file's length.
func qcow2Overlay(size int64, backing, backingFormat string) (map[int64][]byte, int64, error) {
	size = (size + 511) &^ 511 // as qemu-img rounds it
	if size <= 0 || size > maxLayerSize {
		return nil, 0, fmt.Errorf("a disk layer of %d bytes (want 1 to %d)", size, int64(maxLayerSize))
	}
	if backingFormat != "raw" && backingFormat != "qcow2" {
		return nil, 0, fmt.Errorf("backing format %q (want raw or qcow2)", backingFormat)
	}
	be := binary.BigEndian
	perL1 := int64(qcow2Cluster) * (qcow2Cluster / 8) // guest bytes one L2 table maps
	l1Entries := (size + perL1 - 1) / perL1
	l1Clusters := (l1Entries*8 + qcow2Cluster - 1) / qcow2Cluster
	const reftable, refblock, l1 = 1 * qcow2Cluster, 2 * qcow2Cluster, 3 * qcow2Cluster

	h := make([]byte, qcow2HeaderLen, 512)
	be.PutUint32(h[0:], 0x514649fb) // "QFI\xfb"
	be.PutUint32(h[4:], 3)
	// 8: backing file offset, 16: its length (below)
	be.PutUint32(h[20:], qcow2ClusterBits)
	be.PutUint64(h[24:], uint64(size))
	// 32: no encryption
	be.PutUint32(h[36:], uint32(l1Entries))
	be.PutUint64(h[40:], l1)
	be.PutUint64(h[48:], reftable)
	be.PutUint32(h[56:], 1) // refcount table clusters
	// 60: no snapshots; 72: no incompatible features
	be.PutUint64(h[80:], qcow2CompatLazyRef)
	// 88: no autoclear features
	be.PutUint32(h[96:], qcow2RefOrder)
	be.PutUint32(h[100:], qcow2HeaderLen)
	// 104: zlib compression (unused), padding
	ext := make([]byte, 8, 16)
	be.PutUint32(ext[0:], qcow2ExtBackingFmt)
	be.PutUint32(ext[4:], uint32(len(backingFormat)))
	ext = append(ext, backingFormat...)
	ext = append(ext, make([]byte, (8-len(backingFormat)%8)%8)...)
	h = append(h, ext...)
	h = append(h, make([]byte, 8)...) // the end of the extensions
	if len(backing) == 0 || len(backing) > 1023 {
		return nil, 0, fmt.Errorf("backing file name of %d bytes (QEMU reads 1 to 1023)", len(backing))
	}
	be.PutUint64(h[8:], uint64(len(h)))
	be.PutUint32(h[16:], uint32(len(backing)))
	h = append(h, backing...)

	// One refcount block counts 32,768 clusters: header, table, block, L1.
	used := 3 + l1Clusters
	if used > qcow2Cluster/2 {
		return nil, 0, fmt.Errorf("a disk layer of %d bytes needs more than one refcount block", size)
	}
	rt := make([]byte, 8)
	be.PutUint64(rt, refblock)
	rb := make([]byte, 2*used)
	for i := range used {
		be.PutUint16(rb[2*i:], 1)
	}
	return map[int64][]byte{0: h, reftable: rt, refblock: rb}, l1 + l1Entries*8, nil
}

// writeQcow2Overlay writes an empty layer of size bytes over backing to
// path, which it creates or replaces, never through a link, and flushes
// it to the host's disk before it returns.
func writeQcow2Overlay(path string, size int64, backing, backingFormat string) error {
	pieces, length, err := qcow2Overlay(size, backing, backingFormat)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	for off, b := range pieces {
		if _, err = f.WriteAt(b, off); err != nil {
			break
		}
	}
	if err == nil {
		err = f.Truncate(length) // the rest reads as zeros
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
