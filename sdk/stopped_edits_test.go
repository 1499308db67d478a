package sdk

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// Edits of a stopped sandbox made at the same time (a script's two
// 'kosa8 net allow', an SDK user's goroutines: "safe to call from several
// goroutines") must all land, one after the other, and none may make the
// sandbox look alive to the others (they would go to an API that is not
// there).
func TestConcurrentStoppedEdits(t *testing.T) {
	_, sb := newStopped(t, "conc")
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := sb.Allow(ctx, fmt.Sprintf("h%d.example.com", i)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent stopped edit failed: %v", err)
	}
	rules, _ := sb.Rules(ctx)
	if len(rules) != 17 {
		t.Errorf("%d rules, want 17: %v", len(rules), rules)
	}
	if st := sb.Info().State; st != Stopped {
		t.Errorf("state %s", st)
	}
}
