package sdk

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
)

// fill gives every field of v, recursively, a value that is not its
// zero: a field added to the internal type then shows up in its JSON,
// and the comparisons below fail until the SDK's type carries it too.
func fill(t *testing.T, v reflect.Value, n *int) {
	t.Helper()
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString("s" + string(rune('a'+*n%26)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(t, v.Index(0), n)
	case reflect.Map:
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, n)
		fill(t, e, n)
		v.Set(reflect.MakeMap(v.Type()))
		v.SetMapIndex(k, e)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, *n, 0, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(t, v.Field(i), n)
			}
		}
	default:
		t.Fatalf("fill: no value for a %s", v.Type())
	}
}

func jsonMap(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// The SDK's Checkpoint says everything the supervisor's metadata does,
// under the same keys: `kosa8 checkpoint --json` prints it, and scripts
// read keys such as incremental, ram_copied_bytes and verify.
func TestCheckpointCarriesEveryMetaField(t *testing.T) {
	var m checkpoint.Meta
	n := 0
	fill(t, reflect.ValueOf(&m).Elem(), &n)
	want := jsonMap(t, &m)
	cp := fromMeta(&m)
	got := jsonMap(t, cp)
	// What the SDK adds: whether it is the current one, its size on disk.
	for _, k := range []string{"current", "disk_bytes"} {
		if _, ok := want[k]; ok {
			t.Fatalf("the metadata has a key %q of its own now", k)
		}
	}
	cp.Current, cp.DiskBytes = true, 1
	if extra := jsonMap(t, cp); extra["current"] != true || extra["disk_bytes"] != 1.0 {
		t.Fatalf("current and disk_bytes: %v", extra)
	}
	if d := fromMeta(&checkpoint.Meta{}).Disks; d == nil {
		t.Errorf("no disks are null, not {}")
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the SDK's checkpoint differs from its metadata:\n got  %v\n want %v\n keys missing %v", got, want,
			slices.DeleteFunc(slices.Sorted(maps.Keys(want)), func(k string) bool { _, ok := got[k]; return ok }))
	}
}

// Likewise the result of a rewind, as `kosa8 rewind --json` prints it:
// the conflicts with where the sandbox's version went, the time the state
// before took to save, and a saved checkpoint of null when there is none.
func TestRewindResultCarriesEveryField(t *testing.T) {
	var r api.RewindResult
	n := 0
	fill(t, reflect.ValueOf(&r).Elem(), &n)
	if got, want := jsonMap(t, fromRewind(&r)), jsonMap(t, &r); !reflect.DeepEqual(got, want) {
		t.Fatalf("the SDK's rewind result differs from the supervisor's:\n got  %v\n want %v", got, want)
	}
	empty := api.RewindResult{To: "cp1"}
	if got, want := jsonMap(t, fromRewind(&empty)), jsonMap(t, &empty); !reflect.DeepEqual(got, want) {
		t.Fatalf("an empty rewind result: got %v, want %v", got, want)
	}
}
