// Package drivertest has a driver that runs VMs in memory, for the unit
// tests of the agent's controllers.
package drivertest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/knotless-dev/knotless/internal/driver"
)

// Fake runs VMs in memory. A VM's tenant is a snapshot: Export returns
// it, Import replaces it.
type Fake struct {
	mu         sync.Mutex
	States     map[string]driver.State
	Provisions int
	Terminated []string
	CA         []byte
	// Tenants holds each VM's snapshot by VM ID; Objects its object count.
	Tenants map[string][]byte
	Objects map[string]int
	// Exported lists the resources of every export.
	Exported [][]schema.GroupResource
	// Err, if set, is returned by Export and Import.
	Err error
	// Enforced, if set, is the shape a running VM reports.
	Enforced *driver.Enforced
	// ProvisionErr, if set, is what Provision of a new VM returns.
	ProvisionErr error
}

var _ driver.Driver = (*Fake)(nil)

// New returns a Fake whose VMs' CA is a fresh certificate.
func New(t *testing.T) *Fake {
	return &Fake{States: map[string]driver.State{}, CA: TestCA(t), Tenants: map[string][]byte{}, Objects: map[string]int{}}
}

// Provision implements driver.Driver.
func (f *Fake) Provision(_ context.Context, vm driver.VM) (driver.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch f.States[vm.ID] {
	case "", driver.Absent:
		if f.ProvisionErr != nil {
			return driver.Status{}, f.ProvisionErr
		}
		f.Provisions++
		f.States[vm.ID] = driver.Starting
	case driver.Lost:
		return driver.Status{State: driver.Lost, Reason: "gone"}, driver.ErrLost
	}
	return f.status(vm), nil
}

func (f *Fake) status(vm driver.VM) driver.Status {
	st := driver.Status{State: f.States[vm.ID]}
	if st.State == driver.Running {
		st.Endpoint, st.CA, st.Enforced = "https://127.0.0.1:7443/clusters/root", f.CA, f.Enforced
	}
	return st
}

// Set sets a VM's state.
func (f *Fake) Set(id string, s driver.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.States[id] = s
}

// Status implements driver.Driver.
func (f *Fake) Status(_ context.Context, vm driver.VM) (driver.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status(vm), nil
}

// Credential implements driver.Driver.
func (f *Fake) Credential(context.Context, driver.VM) (string, error) { return "tok", nil }

// AccessDIDs implements driver.Driver: a fake tenant names none.
func (f *Fake) AccessDIDs(context.Context, driver.VM) ([]string, error) { return nil, nil }

// Terminate implements driver.Driver.
func (f *Fake) Terminate(_ context.Context, vm driver.VM) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Terminated = append(f.Terminated, vm.ID)
	delete(f.States, vm.ID)
	return nil
}

// Export implements driver.Driver.
func (f *Fake) Export(_ context.Context, vm driver.VM, resources []schema.GroupResource) ([]byte, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.States[vm.ID] != driver.Running {
		return nil, 0, errors.New("the VM does not run")
	}
	f.Exported = append(f.Exported, resources)
	return f.Tenants[vm.ID], f.Objects[vm.ID], f.Err
}

// Import implements driver.Driver.
func (f *Fake) Import(_ context.Context, vm driver.VM, snapshot []byte, _ []schema.GroupResource) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.States[vm.ID] != driver.Running {
		return 0, errors.New("the VM does not run")
	}
	if f.Err != nil {
		return 0, f.Err
	}
	f.Tenants[vm.ID] = snapshot
	return f.Objects[vm.ID], nil
}

// TestCA returns the PEM of a fresh self-signed CA certificate.
func TestCA(t *testing.T) []byte {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tenant"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
