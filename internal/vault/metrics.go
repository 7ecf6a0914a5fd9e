package vault

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/knotless-dev/knotless/internal/promutil"
)

// Read results, the values of the "result" label of reads_total.
const (
	ResultOK            = "ok"
	ResultNotFound      = "not_found"
	ResultForbiddenPath = "forbidden_path"
	ResultUnauthorized  = "unauthorized"
	ResultUnreachable   = "unreachable"
	ResultInvalidValue  = "invalid_value"
	ResultError         = "error"
)

// Metrics of a Client. A nil *Metrics records nothing.
type Metrics struct {
	// Logins counts login attempts (AppRole logins, static-token checks).
	Logins prometheus.Counter
	// LoginErrors counts failed login attempts.
	LoginErrors prometheus.Counter
	// Renewals counts successful token renewals.
	Renewals prometheus.Counter
	// RenewalErrors counts failed token renewals.
	RenewalErrors prometheus.Counter
	// Reads counts ReadKV calls by result.
	Reads *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg (when not
// nil). Collectors already registered by an earlier call are reused, so
// several Clients may share a registry.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: "knotless", Subsystem: "vault", Name: name, Help: help}
	}
	m := &Metrics{
		Logins:        prometheus.NewCounter(opts("logins_total", "Vault login attempts (AppRole logins and static-token checks).")),
		LoginErrors:   prometheus.NewCounter(opts("login_errors_total", "Failed Vault login attempts.")),
		Renewals:      prometheus.NewCounter(opts("renewals_total", "Successful Vault token renewals.")),
		RenewalErrors: prometheus.NewCounter(opts("renewal_errors_total", "Failed Vault token renewals.")),
		Reads:         prometheus.NewCounterVec(opts("reads_total", "KV reads by result."), []string{"result"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.Logins = promutil.Register(reg, m.Logins, &err)
	m.LoginErrors = promutil.Register(reg, m.LoginErrors, &err)
	m.Renewals = promutil.Register(reg, m.Renewals, &err)
	m.RenewalErrors = promutil.Register(reg, m.RenewalErrors, &err)
	m.Reads = promutil.Register(reg, m.Reads, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Metrics) login(err error) {
	if m == nil {
		return
	}
	m.Logins.Inc()
	if err != nil {
		m.LoginErrors.Inc()
	}
}

func (m *Metrics) renewal(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.RenewalErrors.Inc()
		return
	}
	m.Renewals.Inc()
}

func (m *Metrics) read(result string) {
	if m == nil {
		return
	}
	m.Reads.WithLabelValues(result).Inc()
}
