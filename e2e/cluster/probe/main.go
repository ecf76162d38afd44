// Command probe checks a cluster from inside a pod: it serves HTTP, fetches
// URLs and resolves names with Go's own resolver (which follows the pod's
// resolv.conf search path, as a static busybox cannot), and asks the
// apiserver who the pod's service-account token belongs to. It goes into
// the cluster's toolbox test image (e2e/cluster/smoke.sh).
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	if len(os.Args) < 2 {
		fail("usage: probe serve ADDR TEXT | get URL | resolve NAME | whoami")
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "get":
		err = get(os.Args[2:])
	case "resolve":
		err = resolve(os.Args[2:])
	case "whoami":
		err = whoami()
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fail(err.Error())
	}
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, "probe:", message)
	os.Exit(1)
}

// serve answers every request with TEXT and the pod's hostname.
func serve(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: probe serve ADDR TEXT")
	}
	hostname, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	body := fmt.Sprintf("%s from %s\n", args[1], hostname)
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("%s %s %s\n", r.RemoteAddr, r.Method, r.URL.Path)
		_, _ = io.WriteString(w, body)
	})
	fmt.Printf("serving on %s\n", args[0])
	return http.ListenAndServe(args[0], nil)
}

// get prints the body of URL; a status other than 2xx fails.
func get(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: probe get URL")
	}
	client := http.Client{Timeout: 10 * time.Second}
	response, err := client.Get(args[0])
	if err != nil {
		return err
	}
	defer response.Body.Close()
	body, err := io.ReadAll(response.Body)
	if err != nil {
		return fmt.Errorf("reading %s: %w", args[0], err)
	}
	if response.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s: %s", args[0], response.Status, body)
	}
	_, err = os.Stdout.Write(body)
	return err
}

// resolve prints NAME's addresses, one a line.
func resolve(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: probe resolve NAME")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addresses, err := net.DefaultResolver.LookupHost(ctx, args[0])
	if err != nil {
		return err
	}
	fmt.Println(strings.Join(addresses, "\n"))
	return nil
}

// whoami posts a SelfSubjectReview with the pod's token to the apiserver
// by its Service name, trusting only the cluster CA the pod was given, and
// prints the user name the apiserver authenticated.
func whoami() error {
	token, err := os.ReadFile(serviceAccountDir + "/token")
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(serviceAccountDir + "/ca.crt")
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("%s/ca.crt holds no certificate", serviceAccountDir)
	}
	client := http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}},
	}
	review := []byte(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`)
	request, err := http.NewRequest(http.MethodPost,
		"https://kubernetes.default.svc/apis/authentication.k8s.io/v1/selfsubjectreviews", bytes.NewReader(review))
	if err != nil {
		return err
	}
	request.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	request.Header.Set("Content-Type", "application/json")
	response, err := client.Do(request)
	if err != nil {
		return err
	}
	defer response.Body.Close()
	body, err := io.ReadAll(response.Body)
	if err != nil {
		return err
	}
	if response.StatusCode/100 != 2 {
		return fmt.Errorf("SelfSubjectReview: %s: %s", response.Status, body)
	}
	var answer struct {
		Status struct {
			UserInfo struct {
				Username string `json:"username"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		return fmt.Errorf("SelfSubjectReview answer: %w", err)
	}
	fmt.Println(answer.Status.UserInfo.Username)
	return nil
}
