"""The OpenAPI 3 description of the daemon's API, served at `/openapi.json` (kept beside api.py by a test
that checks every route is described and every described path is routed)."""

from __future__ import annotations

_ERROR = {"description": "an error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_JOB = {"description": "the job", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Job"}}}}
_REF = {"name": "ref", "in": "path", "required": True, "description": "a job id or a unique prefix of one",
        "schema": {"type": "string"}}
_FAILS = {"401": _ERROR, "404": _ERROR, "409": _ERROR, "503": _ERROR}

DESCRIPTION: dict = {
    "openapi": "3.0.3",
    "info": {"title": "trainmaster daemon", "version": "1",
             "description": "The CLI's job operations. Every request carries `Authorization: Bearer <token>` "
                            "(the token is in <home>/daemon/token) or the cookie `trainmaster_token`."},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                            "cookie": {"type": "apiKey", "in": "cookie", "name": "trainmaster_token"}},
        "schemas": {
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
            "Job": {"type": "object", "required": ["id", "state"], "additionalProperties": True,
                    "properties": {"id": {"type": "string"}, "state": {"type": "string"},
                                   "reason": {"type": "string", "nullable": True},
                                   "cost_micro_usd": {"type": "integer"},
                                   "attempts": {"type": "array", "items": {"type": "object"}},
                                   "events": {"type": "array", "items": {"type": "object"}}}},
            "Submit": {"type": "object", "required": ["spec"], "additionalProperties": False,
                       "properties": {"spec": {"type": "string", "description": "the job file's absolute path on the "
                                                                                "daemon's machine, under its roots"},
                                      "policy": {"type": "string", "default": "default"}}},
            "Resume": {"type": "object", "additionalProperties": False,
                       "properties": {"max_hours": {"type": "number"}, "max_usd": {"type": "string"}}},
            "LogChunk": {"type": "object", "required": ["attempt", "text", "next_offset", "complete", "state"],
                         "properties": {"attempt": {"type": "string", "nullable": True}, "text": {"type": "string"},
                                        "next_offset": {"type": "integer"}, "complete": {"type": "boolean"},
                                        "state": {"type": "string"}}},
            "Health": {"type": "object", "required": ["pid", "address", "uptime_s", "in_flight", "passes", "status",
                                                      "problems"],
                       "properties": {"pid": {"type": "integer"}, "address": {"type": "string"},
                                      "uptime_s": {"type": "number"}, "passes": {"type": "integer"},
                                      "in_flight": {"type": "array", "items": {"type": "string"}},
                                      "status": {"type": "string", "enum": ["ok", "degraded"]},
                                      "problems": {"type": "array", "items": {"type": "string"},
                                                   "description": "why it is degraded: the database away, "
                                                                  "configuration files that do not validate"},
                                      "connections": {"type": "object", "description": "open, limit, closed_idle, "
                                                                                       "refused"}}},
        },
    },
    "security": [{"bearer": []}, {"cookie": []}],
    "paths": {
        "/v1/health": {"get": {"summary": "pid, address, uptime, jobs in flight",
                               "responses": {"200": {"description": "the daemon", "content": {"application/json": {
                                   "schema": {"$ref": "#/components/schemas/Health"}}}}, "401": _ERROR}}},
        "/v1/jobs": {
            "get": {"summary": "jobs, newest first (unfinished ones unless all=1)",
                    "parameters": [{"name": "all", "in": "query", "schema": {"type": "string", "enum": ["0", "1"]}},
                                   {"name": "limit", "in": "query", "schema": {"type": "integer", "default": 50,
                                                                               "minimum": 0, "maximum": 1000},
                                    "description": "at most this many (0: the most, 1000)"}],
                    "responses": {"200": {"description": "the jobs", "content": {"application/json": {"schema": {
                        "type": "array", "items": {"$ref": "#/components/schemas/Job"}}}}}, "400": _ERROR,
                                  "401": _ERROR}},
            "post": {"summary": "submit a job file under a policy",
                     "requestBody": {"required": True, "content": {"application/json": {"schema": {
                         "$ref": "#/components/schemas/Submit"}}}},
                     "responses": {"201": _JOB, "400": _ERROR, **_FAILS}}},
        "/v1/jobs/{ref}": {"get": {"summary": "a job with its attempts and events", "parameters": [_REF],
                                   "responses": {"200": _JOB, **_FAILS}}},
        "/v1/jobs/{ref}/logs": {"get": {
            "summary": "a chunk of the latest attempt's log", "parameters": [
                _REF, {"name": "attempt", "in": "query", "schema": {"type": "string"}},
                {"name": "offset", "in": "query", "schema": {"type": "integer", "default": 0, "minimum": 0}}],
            "responses": {"200": {"description": "the chunk", "content": {"application/json": {"schema": {
                "$ref": "#/components/schemas/LogChunk"}}}}, "400": _ERROR, **_FAILS}}},
        "/v1/jobs/{ref}/cancel": {"post": {"summary": "stop the job and record its cost so far", "parameters": [_REF],
                                           "responses": {"200": _JOB, **_FAILS}}},
        "/v1/jobs/{ref}/resume": {"post": {
            "summary": "start a failed or cancelled job again from its last committed segment", "parameters": [_REF],
            "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Resume"}}}},
            "responses": {"200": _JOB, "400": _ERROR, **_FAILS}}},
        "/v1/triggers": {"get": {"summary": "the triggers of triggers.yaml, each with what stood in its way at its last "
                                            "tick", "responses": {"200": {"description": "the triggers"}, "401": _ERROR}}},
        "/v1/triggers/{name}/fire": {"post": {
            "summary": "fire a trigger now (its last run must have ended; budgets still gate it)",
            "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "the fire and the job it submitted"}, "404": _ERROR, "409": _ERROR,
                          "401": _ERROR}}},
        "/v1/reload": {"post": {"summary": "read the configuration files again (as SIGHUP does); a set that does not "
                                          "validate leaves the one in force and is reported",
                                "responses": {"200": {"description": "`reloaded` and the files' `problems`"},
                                              "401": _ERROR, "409": _ERROR}}},
        "/openapi.json": {"get": {"summary": "this description", "responses": {"200": {"description": "OpenAPI 3"}}}},
    },
}
