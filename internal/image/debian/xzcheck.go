package debian

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// maxXZIndex bounds the xz index read by checkXZ (about 100k blocks).
const maxXZIndex = 1 << 20

// checkXZ walks the xz container in r through its indices (streams from
// the end backwards) and refuses any block whose header asks for an LZMA2
// dictionary above maxDictSize, before the decoder allocates it: the xz
// library allocates whatever a header asks, up to 4 GiB. It also requires
// that a block header's declared compressed size (which the decoder
// enforces) agrees with the index, so the blocks the decoder reads are the
// ones checked here. A single block without a declared size is the one
// case the decoder could be led past by a shorter block; the .debs reaching
// DebData from Download are verified by SHA256 against the signed index, so
// this bound guards against corrupt files rather than being the trust
// boundary.
func checkXZ(r *io.SectionReader) error {
	pos := r.Size()
	streams := 0
	for pos > 0 {
		var w [4]byte
		if pos >= 4 {
			if _, err := r.ReadAt(w[:], pos-4); err != nil {
				return err
			}
			if w == [4]byte{} {
				pos -= 4
				continue
			}
		}
		if pos < 32 {
			return errors.New("xz: truncated stream")
		}
		var foot [12]byte
		if _, err := r.ReadAt(foot[:], pos-12); err != nil {
			return err
		}
		if foot[10] != 'Y' || foot[11] != 'Z' {
			return errors.New("xz: bad stream footer")
		}
		check := foot[9] & 0x0f
		backward := (int64(binary.LittleEndian.Uint32(foot[4:8])) + 1) * 4
		if backward > maxXZIndex || backward > pos-24 {
			return errors.New("xz: bad index size")
		}
		idxStart := pos - 12 - backward
		idx := make([]byte, backward)
		if _, err := r.ReadAt(idx, idxStart); err != nil {
			return err
		}
		recs, err := xzIndexRecords(idx)
		if err != nil {
			return err
		}
		var blocks int64
		for _, rec := range recs {
			blocks += (rec + 3) &^ 3
			if blocks > idxStart {
				return errors.New("xz: index larger than the stream")
			}
		}
		start := idxStart - blocks - 12
		if start < 0 {
			return errors.New("xz: index larger than the stream")
		}
		var head [12]byte
		if _, err := r.ReadAt(head[:], start); err != nil {
			return err
		}
		if !bytes.Equal(head[:6], []byte("\xfd7zXZ\x00")) || head[7] != check {
			return errors.New("xz: bad stream header")
		}
		off := start + 12
		for i, unpadded := range recs {
			if err := checkXZBlock(r, off, unpadded, check, i == len(recs)-1); err != nil {
				return err
			}
			off += (unpadded + 3) &^ 3
		}
		pos = start
		streams++
	}
	if streams == 0 {
		return errors.New("xz: no stream")
	}
	return nil
}

// xzIndexRecords returns the unpadded sizes of an xz index's records.
func xzIndexRecords(idx []byte) ([]int64, error) {
	if len(idx) < 8 || idx[0] != 0 {
		return nil, errors.New("xz: bad index")
	}
	br := bytes.NewReader(idx[1:])
	n, err := binary.ReadUvarint(br)
	if err != nil || n > uint64(len(idx)) {
		return nil, errors.New("xz: bad index")
	}
	recs := make([]int64, 0, n)
	for range n {
		unpadded, err1 := binary.ReadUvarint(br)
		_, err2 := binary.ReadUvarint(br)
		if err1 != nil || err2 != nil || unpadded < 5 || unpadded > 1<<62 {
			return nil, errors.New("xz: bad index record")
		}
		recs = append(recs, int64(unpadded))
	}
	return recs, nil
}

var xzCheckSize = [16]int64{0, 4, 4, 4, 8, 8, 8, 16, 16, 16, 32, 32, 32, 64, 64, 64}

// checkXZBlock checks the header of the block at off.
func checkXZBlock(r *io.SectionReader, off, unpadded int64, check byte, last bool) error {
	var b [1]byte
	if _, err := r.ReadAt(b[:], off); err != nil {
		return err
	}
	size := (int64(b[0]) + 1) * 4
	if b[0] == 0 || size > unpadded {
		return errors.New("xz: bad block header")
	}
	h := make([]byte, size)
	if _, err := r.ReadAt(h, off); err != nil {
		return err
	}
	br := bytes.NewReader(h[2 : size-4])
	flags := h[1]
	if flags&0x3c != 0 {
		return errors.New("xz: bad block flags")
	}
	if flags&0x40 != 0 {
		c, err := binary.ReadUvarint(br)
		if err != nil || int64(c) != unpadded-size-xzCheckSize[check] {
			return errors.New("xz: block's compressed size disagrees with the index")
		}
	} else if !last {
		return errors.New("xz: a block other than a stream's last must declare its compressed size")
	}
	if flags&0x80 != 0 {
		if _, err := binary.ReadUvarint(br); err != nil {
			return errors.New("xz: bad block header")
		}
	}
	for range int(flags&3) + 1 {
		id, err1 := binary.ReadUvarint(br)
		n, err2 := binary.ReadUvarint(br)
		if err1 != nil || err2 != nil || n > 64 {
			return errors.New("xz: bad filter flags")
		}
		props := make([]byte, n)
		if _, err := io.ReadFull(br, props); err != nil {
			return errors.New("xz: bad filter flags")
		}
		if id == 0x21 {
			if n != 1 || props[0] > 40 {
				return errors.New("xz: bad LZMA2 properties")
			}
			bits := props[0]
			dict := int64(2|bits&1) << (bits/2 + 11)
			if dict > maxDictSize {
				return fmt.Errorf("xz: dictionary of %d bytes, more than the %d allowed", dict, maxDictSize)
			}
		}
	}
	return nil
}
