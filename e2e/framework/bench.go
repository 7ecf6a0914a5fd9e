package framework

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Target is one way to GET the same object.
type Target struct {
	Name   string
	Client *http.Client
	URL    string
	Header http.Header
}

func (t Target) get() error {
	req, err := http.NewRequest(http.MethodGet, t.URL, nil)
	if err != nil {
		return err
	}
	req.Header = t.Header.Clone()
	resp, err := t.Client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: GET %s: %s", t.Name, t.URL, resp.Status)
	}
	return nil
}

// GetFigures are the latency and throughput of one target.
type GetFigures struct {
	P50, P99 time.Duration
	PerSec   float64
}

// MeasureGET measures every target in the same run: latency from n
// sequential GETs taken in turns (target 1, target 2, ..., target 1, ...),
// so that every target sees the same machine; requests/s from n GETs by 16
// concurrent clients per target, run twice (in order, then in reverse
// order) and averaged. Every answer must be 200.
func MeasureGET(n int, targets ...Target) ([]GetFigures, error) {
	for _, t := range targets {
		for range 50 { // warm connections
			if err := t.get(); err != nil {
				return nil, err
			}
		}
	}
	d := make([][]time.Duration, len(targets))
	for range n {
		for i, t := range targets {
			start := time.Now()
			if err := t.get(); err != nil {
				return nil, err
			}
			d[i] = append(d[i], time.Since(start))
		}
	}
	out := make([]GetFigures, len(targets))
	for i := range targets {
		slices.Sort(d[i])
		out[i].P50, out[i].P99 = d[i][n/2], d[i][n*99/100]
	}
	order := make([]int, len(targets))
	for i := range order {
		order[i] = i
	}
	for round := range 2 {
		for _, i := range order {
			r, err := Throughput(targets[i], n)
			if err != nil {
				return nil, err
			}
			out[i].PerSec += r / 2
		}
		if round == 0 {
			slices.Reverse(order)
		}
	}
	return out, nil
}

// Throughput sends n GETs of t from 16 concurrent clients and returns the
// requests per second.
func Throughput(t Target, n int) (float64, error) {
	const clients = 16
	errs := make(chan error, clients)
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range n / clients {
				if err := t.get(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n/clients*clients) / time.Since(start).Seconds(), nil
}

// CompareGET formats each target's figures next to the first target's,
// with the ratios.
func CompareGET(targets []Target, f []GetFigures) []string {
	var lines []string
	base := targets[0].Name
	for i := 1; i < len(targets); i++ {
		a, b, name := f[0], f[i], targets[i].Name
		lines = append(lines,
			fmt.Sprintf("GET latency p50: %s %s, %s %s (%.2fx)", base, a.P50.Round(time.Microsecond), name, b.P50.Round(time.Microsecond), float64(b.P50)/float64(a.P50)),
			fmt.Sprintf("GET latency p99: %s %s, %s %s (%.2fx)", base, a.P99.Round(time.Microsecond), name, b.P99.Round(time.Microsecond), float64(b.P99)/float64(a.P99)),
			fmt.Sprintf("GET requests/s (16 clients): %s %.0f, %s %.0f (%.2fx)", base, a.PerSec, name, b.PerSec, b.PerSec/a.PerSec))
	}
	return lines
}
