package replay

import (
	"reflect"
	"testing"
)

// TestCountersSubCoversEveryField: Sub is written field by field; a field
// it forgets would read as zero in every Stats.Last.
func TestCountersSubCoversEveryField(t *testing.T) {
	var c Counters
	v := reflect.ValueOf(&c).Elem()
	for i := range v.NumField() {
		v.Field(i).SetInt(int64(i + 1))
	}
	if got := c.Sub(Counters{}); got != c {
		t.Errorf("c - 0 = %+v, want %+v", got, c)
	}
	if got := c.Sub(c); got != (Counters{}) {
		t.Errorf("c - c = %+v, want zero", got)
	}
}
