package trace

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// destroyer records the graphs the cache destroys.
type destroyer struct {
	destroyed []gpu.Graph
	fail      error
}

func (d *destroyer) GraphDestroy(g gpu.Graph) error {
	d.destroyed = append(d.destroyed, g)
	return d.fail
}

func key(ps ...uint64) []gpu.DevicePtr {
	out := make([]gpu.DevicePtr, len(ps))
	for i, p := range ps {
		out[i] = gpu.DevicePtr(p)
	}
	return out
}

func TestCacheLRU(t *testing.T) {
	d := &destroyer{}
	c := NewCache(d, 2)
	if err := c.Put(key(1, 2), 10); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(key(3, 4), 20); err != nil {
		t.Fatal(err)
	}
	// Touch (1,2) so that (3,4) is the least recently used.
	if g, ok := c.Get(key(1, 2)); !ok || g != 10 {
		t.Fatalf("Get(1,2) = %d, %v", g, ok)
	}
	if _, ok := c.Get(key(2, 1)); ok {
		t.Fatal("a key in another order hit")
	}
	if _, ok := c.Get(key(1)); ok {
		t.Fatal("a prefix of a key hit")
	}
	if err := c.Put(key(5, 6), 30); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.destroyed, []gpu.Graph{20}) {
		t.Fatalf("destroyed %v, want [20]", d.destroyed)
	}
	if _, ok := c.Get(key(3, 4)); ok {
		t.Fatal("evicted key still hits")
	}
	// Replacing a key destroys the old trace and keeps the count.
	if err := c.Put(key(5, 6), 31); err != nil {
		t.Fatal(err)
	}
	if g, _ := c.Get(key(5, 6)); g != 31 || c.Len() != 2 {
		t.Fatalf("after replace: %d, len %d", g, c.Len())
	}
	// The cache copies keys.
	k := key(7, 8)
	if err := c.Put(k, 40); err != nil {
		t.Fatal(err)
	}
	k[0] = 99
	if _, ok := c.Get(key(7, 8)); !ok {
		t.Fatal("the cache kept the caller's key slice")
	}
	if err := c.Clear(); err != nil {
		t.Fatal(err)
	}
	if c.Len() != 0 || len(d.destroyed) != 5 {
		t.Fatalf("after Clear: len %d, destroyed %v", c.Len(), d.destroyed)
	}
	d.fail = errors.New("boom")
	c.Put(key(1), 1)
	c.Put(key(2), 2)
	if err := c.Put(key(3), 3); err == nil {
		t.Fatal("an eviction's failed destroy was not reported")
	}
	if c.Len() != 2 {
		t.Fatalf("len %d after a failed eviction", c.Len())
	}
}

// TestCacheMatchesModel compares the cache with a list model over many
// lookups, insertions and evictions.
func TestCacheMatchesModel(t *testing.T) {
	d := &destroyer{}
	c := NewCache(d, 5)
	var model [][]gpu.DevicePtr // most recent last
	vals := map[string]gpu.Graph{}
	str := func(k []gpu.DevicePtr) string { return fmt.Sprint(k) }
	for i := 0; i < 500; i++ {
		k := key(uint64(i*7%13), uint64(i*3%11))
		if g, ok := c.Get(k); ok {
			if g != vals[str(k)] {
				t.Fatalf("step %d: Get = %d, want %d", i, g, vals[str(k)])
			}
			j := slices.IndexFunc(model, func(m []gpu.DevicePtr) bool { return slices.Equal(m, k) })
			if j < 0 {
				t.Fatalf("step %d: hit on a key the model evicted", i)
			}
			model = append(slices.Delete(model, j, j+1), k)
			continue
		}
		if slices.ContainsFunc(model, func(m []gpu.DevicePtr) bool { return slices.Equal(m, k) }) {
			t.Fatalf("step %d: miss on a key the model holds", i)
		}
		g := gpu.Graph(i + 1)
		vals[str(k)] = g
		if err := c.Put(k, g); err != nil {
			t.Fatal(err)
		}
		model = append(model, k)
		if len(model) > 5 {
			model = model[1:]
		}
	}
}

func BenchmarkCacheGet(b *testing.B) {
	c := NewCache(&destroyer{}, DefaultCacheSize)
	keys := make([][]gpu.DevicePtr, DefaultCacheSize)
	for i := range keys {
		keys[i] = key(0x7f0000000000+uint64(i)<<20, 0x7f0000100000+uint64(i)<<20, 0x7f0000200000)
		c.Put(keys[i], gpu.Graph(i+1))
	}
	b.Run("hit", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, ok := c.Get(keys[i%len(keys)]); !ok {
				b.Fatal("miss")
			}
		}
	})
	miss := key(1, 2, 3)
	b.Run("miss", func(b *testing.B) {
		for b.Loop() {
			if _, ok := c.Get(miss); ok {
				b.Fatal("hit")
			}
		}
	})
}

// TestStatsArithmetic: Minus and Plus cover every field.
func TestStatsArithmetic(t *testing.T) {
	var s Stats
	v := reflect.ValueOf(&s).Elem()
	for i := range v.NumField() {
		v.Field(i).SetInt(int64(i + 1))
	}
	if got := s.Minus(s); got != (Stats{}) {
		t.Errorf("s - s = %+v", got)
	}
	if got := s.Plus(s).Minus(s); got != s {
		t.Errorf("s + s - s = %+v, want %+v", got, s)
	}
}
