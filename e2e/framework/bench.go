package framework

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// GetFigures are the latency and throughput of one GET target.
type GetFigures struct {
	P50, P99 time.Duration
	PerSec   float64
}

// MeasureGET sends n sequential GETs of u with header hdr through c after a
// warm-up, for the latency percentiles, then n GETs from 16 concurrent
// clients, for the requests per second. Every answer must be 200.
func MeasureGET(c *http.Client, u string, hdr http.Header, n int) (GetFigures, error) {
	get := func() error {
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		req.Header = hdr.Clone()
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", u, resp.Status)
		}
		return nil
	}
	for range 50 { // warm connections
		if err := get(); err != nil {
			return GetFigures{}, err
		}
	}
	d := make([]time.Duration, n)
	for i := range n {
		start := time.Now()
		if err := get(); err != nil {
			return GetFigures{}, err
		}
		d[i] = time.Since(start)
	}
	slices.Sort(d)
	f := GetFigures{P50: d[n/2], P99: d[n*99/100]}
	const clients = 16
	errs := make(chan error, clients)
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range n / clients {
				if err := get(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return GetFigures{}, err
	}
	f.PerSec = float64(n/clients*clients) / time.Since(start).Seconds()
	return f, nil
}

// CompareGET formats two targets' figures side by side with the ratios.
func CompareGET(a, b string, fa, fb GetFigures) []string {
	return []string{
		fmt.Sprintf("GET latency p50: %s %s, %s %s (%.2fx)", a, fa.P50, b, fb.P50, float64(fb.P50)/float64(fa.P50)),
		fmt.Sprintf("GET latency p99: %s %s, %s %s (%.2fx)", a, fa.P99, b, fb.P99, float64(fb.P99)/float64(fa.P99)),
		fmt.Sprintf("GET requests/s (16 clients): %s %.0f, %s %.0f (%.2fx)", a, fa.PerSec, b, fb.PerSec, fb.PerSec/fa.PerSec),
	}
}
