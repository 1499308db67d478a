package checkpoint

import "unsafe"

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
