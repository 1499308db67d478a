package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
)

func TestDoctorQEMURange(t *testing.T) {
	inst := func(v qemu.Version, fw string) qemu.Install {
		return qemu.Install{Binary: "/usr/bin/qemu-system-x86_64", Version: v, VersionLine: "QEMU emulator version " + v.String(), Firmware: fw}
	}
	const fw = "/usr/share/qemu/qboot.rom"
	for _, tc := range []struct {
		name     string
		inst     qemu.Install
		err      error
		ok, warn bool
		says     string
	}{
		{"7.2", inst(qemu.Version{Major: 7, Minor: 2, Micro: 22}, fw), nil, true, false, "supported: 7.2 to 10.x"},
		{"10.0", inst(qemu.Version{Major: 10, Minor: 0, Micro: 2}, fw), nil, true, false, "10.0.2"},
		{"too old", inst(qemu.Version{Major: 6, Minor: 2, Micro: 0}, fw), nil, false, false, "too old"},
		{"newer than tested", inst(qemu.Version{Major: 11, Minor: 0, Micro: 0}, fw), nil, true, true, "newer than kosa8 is tested with"},
		{"no qboot", inst(qemu.Version{Major: 10, Minor: 0, Micro: 2}, ""), nil, true, true, "no qboot.rom"},
		{"broken binary", qemu.Install{}, errors.New("exit status 1"), false, false, "exit status 1"},
	} {
		c := qemuCheck(tc.inst, tc.err, vmspec.AMD64)
		if c.OK != tc.ok || c.Warn != tc.warn || !strings.Contains(c.Detail, tc.says) {
			t.Errorf("%s: %+v; want ok=%v warn=%v, detail with %q", tc.name, c, tc.ok, tc.warn, tc.says)
		}
		if (!c.OK || c.Warn) && c.Fix == "" {
			t.Errorf("%s: no fix offered: %+v", tc.name, c)
		}
	}
}
