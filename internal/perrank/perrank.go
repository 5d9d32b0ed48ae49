// Package perrank runs one goroutine per rank of a collective group: the
// pattern of workload's multi-rank runs and of the tests that drive every
// rank of a communicator from one process.
package perrank

import (
	"errors"
	"fmt"
	"sync"
)

// Each runs f for every rank 0..n-1 in its own goroutine and returns the
// ranks' errors joined, each naming its rank.
func Each(n int, f func(r int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			if err := f(r); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
